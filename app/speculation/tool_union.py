"""The JSON schema the sidecar's structured output is constrained to.

The sidecar writes one JSON value that is, by construction, a call of one of the request's
tools (or an explicit "no call"), so every prediction parses and names a real tool:

- one call:        `{"name": "<tool>", "arguments": {...}}`, `name` first so the tool is
                   chosen before its arguments are written (grammar engines emit properties in
                   schema order);
- parallel calls:  `[{"name": ..., "arguments": ...}, ...]` with at least one item; when
                   parallel calls are allowed this array is the only call form, so each
                   prediction has one spelling;
- no call:         `{"name": "__none__", "arguments": {}}` (`NO_CALL_NAME`), the same shape as
                   a call so one parser handles every output. A tool may not use that name.

The union must compile in both of vLLM's JSON grammar backends (xgrammar, llguidance), so each
tool schema is *relaxed* to keywords both support: whatever is dropped only makes the grammar
accept more, never less, and the candidate is validated against the full schema afterwards
(`app.speculation.validation`). Dropped: `format`s outside `GRAMMAR_FORMATS` (llguidance rejects
unknown formats and xgrammar only knows these), `format` next to `minLength`/`maxLength` and
length bounds next to `pattern` (xgrammar cannot combine them), `multipleOf`, `uniqueItems`,
`contains`, `not`, `if`/`then`/`else`, `dependent*`, `propertyNames`, `unevaluated*`,
`patternProperties` (extra keys then become free), and `allOf` with more than
one branch (xgrammar accepts anything there). Local `$ref`s keep working: a tool schema that
uses them moves to the union's `$defs` under the tool's name and its refs are re-pointed there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.speculation.validation import (
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LIST_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    iter_subschemas,
    tool_parameters,
)

NO_CALL_NAME = "__none__"

# String formats both xgrammar and llguidance turn into grammar (checked against xgrammar
# 0.2.8 / llguidance 1.7 as shipped with vLLM 0.32).
GRAMMAR_FORMATS = frozenset(
    {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri"}
)

_DROPPED_KEYWORDS = frozenset(
    {
        "multipleOf",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        # Identifiers would change how `$ref`s resolve once the schema sits inside the union.
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$dynamicRef",
        "$recursiveAnchor",
        "$recursiveRef",
        "$comment",
    }
)


def invocation_union_schema(
    tools: list[dict[str, Any]], allow_no_call: bool, allow_parallel: bool
) -> dict[str, Any]:
    """JSON schema of one sidecar prediction over OpenAI-form `tools` (see the module doc).

    Raises ValueError for duplicate names, the reserved `NO_CALL_NAME`, or when the schema
    would accept nothing (no tools and no-call not allowed).
    """
    defs: dict[str, Any] = {}
    calls: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in tools:
        name = tool["function"]["name"]
        if name == NO_CALL_NAME:
            raise ValueError(f"tool name {NO_CALL_NAME!r} is reserved for 'no call'")
        if name in seen:
            raise ValueError(f"tool name {name!r} appears twice")
        seen.add(name)
        arguments = grammar_safe_schema(tool_parameters(tool))
        if _has_ref(arguments):
            pointer = "#/$defs/" + name.replace("~", "~0").replace("/", "~1")
            defs[name] = _repoint_refs(arguments, pointer)
            arguments = {"$ref": pointer}
        calls.append(_call_object(name, arguments))

    branches: list[dict[str, Any]] = []
    if calls:
        one_call = _any_of(calls)
        branches.append(
            {"type": "array", "items": one_call, "minItems": 1} if allow_parallel else one_call
        )
    if allow_no_call:
        branches.append(
            _call_object(
                NO_CALL_NAME, {"type": "object", "properties": {}, "additionalProperties": False}
            )
        )
    if not branches:
        raise ValueError("no tools and no-call not allowed: the union would accept nothing")
    schema = _any_of(branches)
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def grammar_safe_schema(schema: Any) -> Any:
    """A copy of `schema` relaxed to keywords both grammar backends support (see module doc)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in _DROPPED_KEYWORDS:
            continue
        if keyword in SUBSCHEMA_KEYWORDS or (keyword == "items" and isinstance(value, list)):
            out[keyword] = (
                [grammar_safe_schema(v) for v in value]
                if isinstance(value, list)
                else grammar_safe_schema(value)
            )
        elif keyword in SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
            out[keyword] = [grammar_safe_schema(v) for v in value]
        elif keyword in SUBSCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            out[keyword] = {k: grammar_safe_schema(v) for k, v in value.items()}
        else:
            out[keyword] = value
    return _drop_unsupported_combinations(out)


def _drop_unsupported_combinations(schema: dict[str, Any]) -> dict[str, Any]:
    if "format" in schema and (
        schema["format"] not in GRAMMAR_FORMATS or "minLength" in schema or "maxLength" in schema
    ):
        del schema["format"]
    if "pattern" in schema:
        schema.pop("minLength", None)
        schema.pop("maxLength", None)
    if "patternProperties" in schema:
        # Keys matching a pattern were allowed; without the patterns only "anything extra"
        # still allows them (relaxing, never tightening).
        del schema["patternProperties"]
        schema["additionalProperties"] = True
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        del schema["allOf"]
    return schema


def _call_object(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _any_of(branches: list[dict[str, Any]]) -> dict[str, Any]:
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _has_ref(schema: Any) -> bool:
    return any(isinstance(sub.get("$ref"), str) for sub in iter_subschemas(schema))


def _repoint_refs(schema: Any, base: str) -> Any:
    """Copy of `schema` whose local refs `#<pointer>` become `<base><pointer>`."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword == "$ref" and isinstance(value, str):
            if not value.startswith("#"):
                raise ValueError(f"$ref {value!r} is not local; only '#...' refs are supported")
            out[keyword] = base + value[1:]
        elif keyword in SUBSCHEMA_KEYWORDS or keyword in SUBSCHEMA_LIST_KEYWORDS:
            out[keyword] = (
                [_repoint_refs(v, base) for v in value]
                if isinstance(value, list)
                else _repoint_refs(value, base)
            )
        elif keyword in SUBSCHEMA_MAP_KEYWORDS and isinstance(value, Mapping):
            out[keyword] = {k: _repoint_refs(v, base) for k, v in value.items()}
        else:
            out[keyword] = value
    return out
