"""JSON Schema validation of tool schemas and arguments (app.speculation.validation)."""

from __future__ import annotations

from typing import Any

import pytest

from app.speculation.validation import (
    check_schema,
    compiled_validator,
    is_valid_against,
    iter_subschemas,
    resolve_local_ref,
    tool_parameters,
    validate_arguments,
)

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "location": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "date": {"type": "string", "format": "date"},
        "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}},
    },
    "required": ["location"],
    "additionalProperties": False,
}

WITH_REFS: dict[str, Any] = {
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
        }
    },
    "type": "object",
    "properties": {
        "a": {"$ref": "#/$defs/Point"},
        "path": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
    },
    "required": ["a"],
}


def test_valid_arguments_give_no_errors() -> None:
    args = {"location": {"city": "Paris"}, "unit": "celsius", "days": 3, "date": "2024-02-29"}
    assert validate_arguments(args, WEATHER) == []


def test_missing_required_is_reported_at_its_object() -> None:
    errors = validate_arguments({"location": {"country": "FR"}}, WEATHER)
    assert errors == ["$.location: 'city' is a required property"]


def test_additional_properties_false_is_enforced_at_every_level() -> None:
    errors = validate_arguments(
        {"location": {"city": "Paris", "zip": "75001"}, "extra": 1}, WEATHER
    )
    assert len(errors) == 2
    assert errors[0].startswith("$: Additional properties are not allowed ('extra'")
    assert errors[1].startswith("$.location: Additional properties are not allowed ('zip'")


def test_enum_and_bounds() -> None:
    errors = validate_arguments(
        {"location": {"city": "Paris"}, "unit": "kelvin", "days": 30}, WEATHER
    )
    assert errors == [
        "$.days: 30 is greater than the maximum of 14",
        "$.unit: 'kelvin' is not one of ['celsius', 'fahrenheit']",
    ]


def test_array_items_are_reported_with_their_index() -> None:
    errors = validate_arguments({"location": {"city": "Paris"}, "hours": [1, 25, "x"]}, WEATHER)
    assert errors == [
        "$.hours[1]: 25 is greater than the maximum of 23",
        "$.hours[2]: 'x' is not of type 'integer'",
    ]


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date", "2024-02-29", "2023-02-29"),
        ("date-time", "2024-05-01T10:00:00Z", "2024-05-01 10:00"),
        ("time", "10:00:00+02:00", "25:00:00Z"),
        ("email", "a@example.com", "not-an-email"),
        ("uri", "https://example.com/x", "example dot com"),
        ("ipv4", "10.0.0.1", "10.0.0.300"),
    ],
)
def test_formats_are_checked(fmt: str, good: str, bad: str) -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}}
    assert validate_arguments({"v": good}, schema) == []
    assert validate_arguments({"v": bad}, schema) == [f"$.v: {bad!r} is not a {fmt!r}"]


def test_local_refs_are_followed() -> None:
    assert (
        validate_arguments({"a": {"x": 1, "y": 2.5}, "path": [{"x": 0, "y": 0}]}, WITH_REFS) == []
    )
    errors = validate_arguments({"a": {"x": 1}, "path": [{"x": "0", "y": 0}]}, WITH_REFS)
    assert errors == ["$.a: 'y' is a required property", "$.path[0].x: '0' is not of type 'number'"]


def test_validators_are_cached_per_schema_content_not_identity() -> None:
    reordered = dict(reversed(list(WEATHER.items())))
    assert compiled_validator(WEATHER) is compiled_validator(reordered)
    assert compiled_validator(WEATHER) is not compiled_validator(WITH_REFS)


def test_cached_validator_is_immune_to_later_mutation_of_the_schema() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert validate_arguments({"n": "x"}, schema)
    compiled = compiled_validator(schema)
    schema["properties"]["n"]["type"] = "string"  # a different schema now: new key, new validator
    assert compiled_validator(schema) is not compiled
    assert compiled.is_valid({"n": "x"}) is False


def test_unresolvable_ref_is_an_error_not_an_exception() -> None:
    errors = validate_arguments({"a": 1}, {"properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert len(errors) == 1 and errors[0].startswith("$: schema cannot be applied")


def test_long_instances_are_cut_in_messages() -> None:
    errors = validate_arguments({"location": {"city": "x" * 5000}, "unit": "y" * 5000}, WEATHER)
    assert errors and all(len(e) < 400 for e in errors)


def test_check_schema_accepts_tool_schemas() -> None:
    assert check_schema(WEATHER) is None
    assert check_schema(WITH_REFS) is None
    assert check_schema({}) is None  # no constraints: any object
    assert check_schema({"type": ["object", "null"]}) is None


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ([], "must be a JSON Schema object"),
        ({"type": "strng"}, "not a valid JSON Schema at $.type"),
        ({"type": "object", "properties": {"a": {"type": 3}}}, "not a valid JSON Schema"),
        ({"type": "object", "required": "a"}, "not a valid JSON Schema at $.required"),
        ({"properties": {"a": {"$ref": "#/$defs/nope"}}}, "points nowhere"),
        ({"properties": {"a": {"$ref": "https://example.com/s.json"}}}, "not a local reference"),
        ({"properties": {"a": {"$ref": "#anchor"}}}, "anchors are not supported"),
        ({"type": "string"}, "must describe a JSON object"),
        ({"type": "object", "default": {1, 2}}, "not JSON-serialisable"),
    ],
)
def test_check_schema_rejects_with_a_reason(schema: Any, fragment: str) -> None:
    problem = check_schema(schema)
    assert problem is not None and fragment in problem


def test_check_schema_for_non_parameter_schemas() -> None:
    assert check_schema({"type": "array"}, tool_parameters=False) is None
    assert check_schema({"type": "array"}) is not None


def test_ref_like_data_is_not_taken_for_a_ref() -> None:
    # A property *named* "$ref" and a default shaped like a ref are data, not references.
    schema = {
        "type": "object",
        "properties": {
            "$ref": {"type": "string"},
            "d": {"type": "object", "default": {"$ref": "#/x"}},
        },
    }
    assert check_schema(schema) is None
    assert [s for s in iter_subschemas(schema) if isinstance(s.get("$ref"), str)] == []


def test_resolve_local_ref_handles_escapes_and_indices() -> None:
    root = {
        "$defs": {"a/b": {"type": "string"}, "t~x": {"type": "integer"}},
        "anyOf": [{"type": "null"}],
    }
    assert resolve_local_ref(root, "#") is root
    assert resolve_local_ref(root, "#/$defs/a~1b") == {"type": "string"}
    assert resolve_local_ref(root, "#/$defs/t~0x") == {"type": "integer"}
    assert resolve_local_ref(root, "#/anyOf/0") == {"type": "null"}
    with pytest.raises(LookupError):
        resolve_local_ref(root, "#/anyOf/3")


def test_is_valid_against_resolves_refs_in_the_root() -> None:
    branch = {"$ref": "#/$defs/Point"}
    assert is_valid_against({"x": 1, "y": 2}, branch, WITH_REFS)
    assert not is_valid_against({"x": 1}, branch, WITH_REFS)


def test_tool_without_parameters_takes_an_empty_object() -> None:
    assert tool_parameters({"type": "function", "function": {"name": "ping"}}) == {
        "type": "object",
        "properties": {},
    }


def test_the_metaschema_check_never_hands_a_clients_pattern_to_pythons_re(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jsonschema checks `format: regex` (every `pattern`, every `patternProperties` key) by
    compiling it with Python's `re`, whose compile time the client chooses and that nothing
    can stop. The metaschema check compiles them with RE2 instead (issue 39)."""
    import re

    client = {"(?i)[a-z\u0100-\u017f]{1,64}metaschema-probe", "^(?i)key-probe$"}
    real = re.compile

    def guarded(pattern: Any, *args: Any, **kwargs: Any) -> Any:
        assert pattern not in client, f"Python's re compiled the client's {pattern!r}"
        return real(pattern, *args, **kwargs)

    monkeypatch.setattr(re, "compile", guarded)
    schema = {"type": "object", "properties": {"x": {
        "type": "string", "pattern": "(?i)[a-z\u0100-\u017f]{1,64}metaschema-probe"}},
        "patternProperties": {"^(?i)key-probe$": {"type": "string"}}}
    assert check_schema(schema) is None
    broken = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}
    assert "not a valid JSON Schema" in (check_schema(broken) or "")
