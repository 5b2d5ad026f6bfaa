"""The sidecar's output schema over a request's tools (app.speculation.tool_union)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.speculation.tool_union import (
    NO_CALL_NAME,
    grammar_safe_schema,
    invocation_union_schema,
)
from app.speculation.validation import check_schema, validate_arguments


def _tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"{name} tool"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


WEATHER = _tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["city"],
    },
)
ROUTE = _tool(
    "plan_route",
    {
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "start": {"$ref": "#/$defs/Point"},
            "stops": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
        },
        "required": ["start"],
    },
)
PING = _tool("ping")
TOOLS = [WEATHER, ROUTE, PING]

OSLO: dict[str, Any] = {"name": "get_weather", "arguments": {"city": "Oslo"}}
ROUTE_CALL: dict[str, Any] = {
    "name": "plan_route",
    "arguments": {"start": {"lat": 1, "lon": 2.5}, "stops": []},
}
NO_CALL: dict[str, Any] = {"name": NO_CALL_NAME, "arguments": {}}


def _accepts(schema: dict[str, Any], value: Any) -> bool:
    return validate_arguments(value, schema) == []


def test_single_tool_union_is_the_call_object_with_name_first() -> None:
    schema = invocation_union_schema([WEATHER], allow_no_call=False, allow_parallel=False)
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": WEATHER["function"]["parameters"],
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    assert list(schema["properties"]) == ["name", "arguments"]


def test_union_accepts_exactly_calls_of_the_tools() -> None:
    schema = invocation_union_schema(TOOLS, allow_no_call=False, allow_parallel=False)
    assert check_schema(schema, tool_parameters=False) is None
    assert _accepts(schema, OSLO)
    assert _accepts(schema, ROUTE_CALL)
    assert _accepts(schema, {"name": "ping", "arguments": {}})
    assert not _accepts(schema, {"name": "get_weather", "arguments": {"unit": "c"}})  # no city
    assert not _accepts(schema, {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "k"}})
    assert not _accepts(schema, {"name": "nope", "arguments": {}})
    assert not _accepts(schema, {"name": "get_weather", "arguments": {"city": "Oslo"}, "x": 1})
    assert not _accepts(schema, {"name": "get_weather"})
    assert not _accepts(schema, NO_CALL)
    assert not _accepts(schema, [OSLO])


def test_refs_are_hoisted_into_the_union_defs() -> None:
    schema = invocation_union_schema(TOOLS, allow_no_call=False, allow_parallel=False)
    assert schema["$defs"]["plan_route"]["properties"]["start"] == {
        "$ref": "#/$defs/plan_route/$defs/Point"
    }
    route_branch = schema["anyOf"][1]
    assert route_branch["properties"]["arguments"] == {"$ref": "#/$defs/plan_route"}
    bad_stop = copy.deepcopy(ROUTE_CALL)
    bad_stop["arguments"]["stops"] = [{"lat": 1}]
    assert not _accepts(schema, bad_stop)
    assert "$defs" not in invocation_union_schema([WEATHER], False, False)


def test_no_call_branch() -> None:
    schema = invocation_union_schema(TOOLS, allow_no_call=True, allow_parallel=False)
    assert _accepts(schema, NO_CALL)
    assert not _accepts(schema, {"name": NO_CALL_NAME, "arguments": {"why": "chat"}})
    only = invocation_union_schema([], allow_no_call=True, allow_parallel=True)
    assert _accepts(only, NO_CALL) and not _accepts(only, OSLO)


def test_parallel_form_is_a_non_empty_array_and_the_only_call_form() -> None:
    schema = invocation_union_schema(TOOLS, allow_no_call=True, allow_parallel=True)
    assert check_schema(schema, tool_parameters=False) is None
    assert _accepts(schema, [OSLO, ROUTE_CALL, OSLO])
    assert _accepts(schema, [OSLO])
    assert _accepts(schema, NO_CALL)
    assert not _accepts(schema, OSLO)  # one spelling per prediction: a single call is [call]
    assert not _accepts(schema, [])
    assert not _accepts(schema, [OSLO, NO_CALL])
    strict = invocation_union_schema(TOOLS, allow_no_call=False, allow_parallel=True)
    assert strict["type"] == "array" and not _accepts(strict, NO_CALL)


def test_invalid_tool_lists_are_rejected() -> None:
    with pytest.raises(ValueError, match="reserved"):
        invocation_union_schema([_tool(NO_CALL_NAME)], True, False)
    with pytest.raises(ValueError, match="twice"):
        invocation_union_schema([WEATHER, WEATHER], True, False)
    with pytest.raises(ValueError, match="accept nothing"):
        invocation_union_schema([], allow_no_call=False, allow_parallel=True)


def test_tools_are_not_modified() -> None:
    before = copy.deepcopy(TOOLS)
    invocation_union_schema(TOOLS, True, True)
    assert before == TOOLS


def test_grammar_safe_schema_only_relaxes() -> None:
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date"},
            "price": {"type": "string", "format": "float"},
            "code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3},
            "slug": {"type": "string", "format": "hostname", "minLength": 2},
            "step": {"type": "number", "multipleOf": 0.5, "maximum": 10},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "meta": {
                "type": "object",
                "patternProperties": {"^x-": {}},
                "additionalProperties": False,
            },
            "both": {"allOf": [{"type": "string"}, {"enum": ["a", "b"]}]},
            "one": {"allOf": [{"type": "string"}]},
            # Property names equal to dropped keywords are data, not keywords.
            "format": {"type": "string", "enum": ["pdf", "txt"]},
            "not": {"type": "boolean", "const": True},
        },
        "if": {"required": ["when"]},
        "then": {"required": ["code"]},
    }
    safe = grammar_safe_schema(schema)
    props = safe["properties"]
    assert "$schema" not in safe and "if" not in safe and "then" not in safe
    assert props["when"] == {"type": "string", "format": "date"}
    assert props["price"] == {"type": "string"}
    assert props["code"] == {"type": "string", "pattern": "^[A-Z]+$"}
    assert props["slug"] == {"type": "string", "minLength": 2}
    assert props["step"] == {"type": "number", "maximum": 10}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["meta"] == {"type": "object", "additionalProperties": True}
    assert props["both"] == {}
    assert props["one"] == {"allOf": [{"type": "string"}]}
    assert props["format"] == schema["properties"]["format"]
    assert props["not"] == schema["properties"]["not"]
    assert schema["properties"]["price"]["format"] == "float"  # input untouched
    # Relaxing: everything the original accepts, the safe one accepts.
    sample = {
        "when": "2024-01-01",
        "price": "1.5",
        "code": "AB",
        "step": 1.5,
        "tags": ["a"],
        "not": True,
    }
    assert _accepts(schema, sample) and _accepts(safe, sample)


def _union_variants() -> list[dict[str, Any]]:
    return [
        invocation_union_schema(TOOLS, no_call, parallel)
        for no_call in (True, False)
        for parallel in (True, False)
    ]


def test_union_compiles_in_xgrammar() -> None:
    xgr = pytest.importorskip("xgrammar")
    for schema in _union_variants():
        xgr.Grammar.from_json_schema(json.dumps(schema))


def test_union_compiles_in_llguidance() -> None:
    llguidance = pytest.importorskip("llguidance")
    for schema in _union_variants():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": True}
        )
        assert llguidance.LLMatcher.validate_grammar(grammar, None) == ""
