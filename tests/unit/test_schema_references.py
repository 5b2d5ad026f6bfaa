"""Schemas never reach the network: every reference keyword, at several depths, is refused by
`check_schema` with the keyword named, and a validator built anyway (the second guard) never
fetches it. A local listener records every request; it must see none."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
import referencing.exceptions

from app.speculation.schema_limits import expansion_size
from app.speculation.validation import (
    LOCAL_ONLY_REGISTRY,
    build_validator,
    check_schema,
    is_valid_against,
    validate_arguments,
)
from tests.http_listener import RecordingListener as Listener

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DRAFT_2019 = "https://json-schema.org/draft/2019-09/schema"


@pytest.fixture(scope="module")
def server() -> Iterator[Listener]:
    running = Listener()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def listener(server: Listener) -> Listener:
    server.hits.clear()
    return server


# Where the reference sits: (schema around `node`, an instance whose validation reaches it).
Placement = Callable[[dict[str, Any]], dict[str, Any]]
PLACEMENTS: dict[str, tuple[Placement, Any]] = {
    "property": (lambda node: {"type": "object", "properties": {"x": node}}, {"x": 1}),
    "items-anyOf-additionalProperties": (
        lambda node: {"type": "object", "properties": {"a": {"type": "array", "items": {
            "anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": node}]}}}},
        {"a": [{"k": 1}]},
    ),
    "defs-allOf": (
        lambda node: {"type": "object", "properties": {"x": {"$ref": "#/$defs/d"}},
                      "$defs": {"d": {"allOf": [node]}}},
        {"x": 1},
    ),
    "if-then-not-not": (
        lambda node: {"type": "object", "if": {"required": ["x"]},
                      "then": {"properties": {"x": {"not": {"not": node}}}}},
        {"x": 1},
    ),
    "dependentSchemas": (
        lambda node: {"type": "object", "dependentSchemas": {"x": {"properties": {"x": node}}}},
        {"x": 1},
    ),
    # A local reference into a keyword no walk knows makes that part a subschema.
    "behind-a-local-ref-into-an-unknown-keyword": (
        lambda node: {"type": "object", "properties": {"x": {"$ref": "#/x-extra/0"}},
                      "x-extra": [node]},
        {"x": 1},
    ),
}


def remote_nodes(url: str) -> dict[str, tuple[str, dict[str, Any], str | None]]:
    """name -> (keyword the refusal names, node, dialect the node needs or None)."""
    return {
        "$ref": ("$ref", {"$ref": f"{url}/ref"}, None),
        "$dynamicRef": ("$dynamicRef",
                        {"anyOf": [{"type": "string"}, {"$dynamicRef": f"{url}/dynamic"}]}, None),
        "$recursiveRef": ("$recursiveRef", {"$recursiveRef": f"{url}/recursive"}, DRAFT_2019),
        "$id-relative": ("$id", {"$id": f"{url}/base/", "$ref": "other.json"}, None),
        "nested-$id": ("$id", {"$id": f"{url}/base/", "type": "integer"}, None),
    }


def place(where: str, node: dict[str, Any], dialect: str | None) -> tuple[dict[str, Any], Any]:
    build, instance = PLACEMENTS[where]
    schema = build(node)
    if dialect is not None:
        schema = {"$schema": dialect, **schema}
    return schema, instance


def assert_never_fetched(schema: dict[str, Any], instance: Any, listener: Listener) -> None:
    """Every validation path the server has runs on `schema` without one request."""
    validate_arguments(instance, schema)
    is_valid_against(instance, schema, schema)
    try:
        build_validator(schema).is_valid(instance)
    except referencing.exceptions.Unresolvable:
        pass  # refused: what the registry is for
    assert listener.hits == []


@pytest.mark.parametrize("where", list(PLACEMENTS))
@pytest.mark.parametrize("name", list(remote_nodes("http://x")))
def test_remote_references_are_refused_and_never_fetched(
    listener: Listener, name: str, where: str
) -> None:
    keyword, node, dialect = remote_nodes(listener.url)[name]
    schema, instance = place(where, node, dialect)
    problem = check_schema(schema)
    assert problem is not None and problem.startswith(keyword), problem
    assert "not" in problem  # says it is refused, not just where it is
    assert_never_fetched(schema, instance, listener)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_a_draft_07_dependencies_held_ref_is_refused_and_never_fetched(
    listener: Listener, depth: int
) -> None:
    inner: dict[str, Any] = {"$ref": f"{listener.url}/dependencies"}
    for _ in range(depth):
        inner = {"properties": {"x": inner}}
    schema = {"$schema": DRAFT_07, "type": "object", "dependencies": {"x": inner}}
    problem = check_schema(schema)
    assert problem is not None and problem.startswith("$ref"), problem
    instance: Any = 1
    for _ in range(depth + 1):
        instance = {"x": instance}
    assert_never_fetched(schema, instance, listener)


def test_the_listener_would_be_fetched_without_the_registry(listener: Listener) -> None:
    """The control: jsonschema's own default does fetch these schemas, so the tests above see
    the registry at work, not a listener nobody could reach."""
    schema, instance = place("property", {"$ref": f"{listener.url}/ref"}, None)
    jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert listener.hits == ["/ref"]


def test_the_registry_refuses_every_uri(listener: Listener) -> None:
    with pytest.raises(referencing.exceptions.Unresolvable):
        LOCAL_ONLY_REGISTRY.resolver().lookup(f"{listener.url}/anything")
    assert listener.hits == []


def test_local_references_still_work(listener: Listener) -> None:
    schema = {
        "type": "object",
        "properties": {
            "point": {"$ref": "#/$defs/point"},
            "again": {"$dynamicRef": "#/$defs/point"},
            "tree": {"$ref": "#/$defs/tree"},
        },
        "$defs": {
            "point": {"type": "object", "properties": {"x": {"type": "integer"}},
                      "required": ["x"]},
            "tree": {"type": "object", "properties": {"kids": {"type": "array",
                                                               "items": {"$ref": "#/$defs/tree"}}}},
        },
    }
    assert check_schema(schema) is None
    assert validate_arguments({"point": {"x": 1}, "again": {"x": 2},
                               "tree": {"kids": [{"kids": []}]}}, schema) == []
    assert validate_arguments({"point": {"x": "1"}}, schema) != []
    assert validate_arguments({"again": {}}, schema) != []
    recursive = {"$schema": DRAFT_2019, "type": "object",
                 "properties": {"next": {"$recursiveRef": "#"}}}
    assert check_schema(recursive) is None
    assert validate_arguments({"next": {"next": {}}}, recursive) == []
    assert validate_arguments({"next": {"next": 3}}, recursive) != []
    # An `$id` at the top names the schema itself; references still resolve inside it.
    named = {"$id": f"{listener.url}/tool.json", "type": "object",
             "properties": {"p": {"$ref": "#/$defs/p"}}, "$defs": {"p": {"type": "string"}}}
    assert check_schema(named) is None
    assert validate_arguments({"p": 1}, named) != []
    assert validate_arguments({"p": "a"}, named) == []
    assert listener.hits == []


def test_a_top_level_schema_dialect_url_is_never_fetched(listener: Listener) -> None:
    schema = {"$schema": f"{listener.url}/dialect", "type": "object"}
    check_schema(schema)
    assert_never_fetched(schema, {}, listener)


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"}, "draft-03"),
        ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
          "properties": {"x": {"id": "http://example.com/x", "type": "string"}}}, "id "),
        ({"type": "object", "properties": {"x": {"$recursiveRef": "#/$defs/y"}}},
         "$recursiveRef"),
        ({"type": "object", "properties": {"x": {"$dynamicRef": "#meta"}}}, "anchors"),
        ({"type": "object", "properties": {"x": {"$dynamicRef": "#/$defs/none"}}},
         "points nowhere"),
    ],
)
def test_other_reference_forms_are_refused_with_a_reason(schema: dict[str, Any],
                                                         fragment: str) -> None:
    problem = check_schema(schema)
    assert problem is not None and fragment in problem, problem


def test_a_property_named_like_a_reference_keyword_is_data() -> None:
    schema = {"type": "object", "properties": {
        "$dynamicRef": {"type": "string"}, "$id": {"type": "string"},
        "d": {"default": {"$dynamicRef": "http://example.com/"}}}}
    assert check_schema(schema) is None


def test_expansion_counts_dynamic_references() -> None:
    """A doubling chain through `$dynamicRef` costs what the same chain through `$ref` does."""
    def chain(keyword: str) -> dict[str, Any]:
        defs: dict[str, Any] = {f"a{i}": {"allOf": [{keyword: f"#/$defs/a{i + 1}"}] * 2}
                                for i in range(20)}
        defs["a20"] = {"type": "string"}
        return {"type": "object", "properties": {"x": {keyword: "#/$defs/a0"}}, "$defs": defs}

    assert expansion_size(chain("$dynamicRef"), 10_000) > 10_000
    assert expansion_size(chain("$ref"), 10_000) > 10_000
