"""Canonical form of a tool invocation: when are two calls "the same call"?

A speculated call pays off only if it equals the call the main model commits, and a
pre-executed tool result may be reused only then. Equality is semantic (docs/tools.md):
same name; arguments equal after filling schema defaults; key order ignored; an integer and a
float with the same value are equal (`1 == 1.0`); strings compare exactly; `true` is not `1`.
Parallel calls match as a multiset.

The canonical form makes that equality a string comparison: `canonical_invocation` is stable
JSON, so it can key a dict of pre-executed results.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.speculation.validation import is_valid_against, resolve_local_ref

# `$ref` chains followed without descending into the data; more means a cycle like
# {"$defs": {"a": {"$ref": "#/$defs/a"}}}, which has no defaults to give anyway.
_MAX_REF_HOPS = 32


class Invocation(BaseModel):
    """One tool call as a semantic object: what the sidecar predicts and the main model commits."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


def canonical_value(value: Any) -> Any:
    """JSON value with object keys sorted and integral floats turned into ints, recursively.

    Booleans stay booleans (in Python `True == 1`, in JSON they are different values);
    non-integral and non-finite floats stay floats.
    """
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {key: canonical_value(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [canonical_value(item) for item in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_arguments(
    arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Arguments with the schema's defaults filled in, numbers normalised and keys sorted.

    Defaults are filled into every object the schema describes: nested objects, array items
    (`items`, `prefixItems`), through local `$ref`s, `allOf`, and the one `anyOf`/`oneOf`
    branch the value matches (none is chosen when several match, since that is ambiguous).
    The input is not modified.
    """
    filled: Any = dict(arguments)
    if schema is not None:
        filled = _fill_defaults(filled, schema, schema, 0)
    result = canonical_value(filled)
    assert isinstance(result, dict)
    return result


def canonical_invocation(invocation: Invocation, schema: Mapping[str, Any] | None = None) -> str:
    """Stable JSON text of the canonical invocation, usable as a dict key."""
    canonical = {
        "name": invocation.name,
        "arguments": canonical_arguments(invocation.arguments, schema),
    }
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class MultisetMatch:
    """Result of matching speculated calls against committed calls, by index into each list."""

    pairs: list[tuple[int, int]] = field(default_factory=list)  # (candidate, committed)
    unmatched_candidates: list[int] = field(default_factory=list)
    unmatched_committed: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every committed call had a candidate and no candidate was left over."""
        return not self.unmatched_candidates and not self.unmatched_committed


def multiset_match(
    candidates: Sequence[Invocation],
    committed: Sequence[Invocation],
    schemas_by_name: Mapping[str, Mapping[str, Any] | None],
) -> MultisetMatch:
    """Pair candidates with equal committed calls, ignoring order, each call used at most once.

    Canonical equality is an equivalence relation, so greedy pairing within each equivalence
    class is a maximum matching; pairs follow the committed order, and within one class the
    earliest candidate goes first. A name missing from `schemas_by_name` compares without
    defaults.
    """
    waiting: dict[str, list[int]] = {}
    for index, candidate in enumerate(candidates):
        key = canonical_invocation(candidate, schemas_by_name.get(candidate.name))
        waiting.setdefault(key, []).append(index)
    pairs: list[tuple[int, int]] = []
    unmatched_committed: list[int] = []
    for index, call in enumerate(committed):
        key = canonical_invocation(call, schemas_by_name.get(call.name))
        queue = waiting.get(key)
        if queue:
            pairs.append((queue.pop(0), index))
        else:
            unmatched_committed.append(index)
    leftover = sorted(i for queue in waiting.values() for i in queue)
    return MultisetMatch(pairs, leftover, unmatched_committed)


def _fill_defaults(value: Any, schema: Any, root: Mapping[str, Any], ref_hops: int) -> Any:
    if not isinstance(schema, dict):
        return value  # boolean schemas carry no defaults
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref_hops < _MAX_REF_HOPS:
        try:
            value = _fill_defaults(value, resolve_local_ref(root, ref), root, ref_hops + 1)
        except LookupError:
            pass  # check_schema rejects dangling refs; canonical form never fails on them
    for branch in _schema_list(schema.get("allOf")):
        value = _fill_defaults(value, branch, root, ref_hops)
    for keyword in ("anyOf", "oneOf"):
        branches = _schema_list(schema.get(keyword))
        matching = [b for b in branches if is_valid_against(value, b, root)]
        if len(matching) == 1:
            value = _fill_defaults(value, matching[0], root, ref_hops)
    if isinstance(value, dict):
        return _fill_object(value, schema, root)
    if isinstance(value, list):
        return _fill_array(value, schema, root)
    return value


def _fill_object(value: dict[str, Any], schema: dict[str, Any], root: Mapping[str, Any]) -> Any:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    out = dict(value)
    for name, subschema in properties.items():
        if name not in out:
            found, default = _default_of(subschema, root, 0)
            if found:
                out[name] = copy.deepcopy(default)
    additional = schema.get("additionalProperties")
    for name, item in out.items():
        subschema = properties[name] if name in properties else additional
        if isinstance(subschema, dict):
            out[name] = _fill_defaults(item, subschema, root, 0)
    return out


def _fill_array(value: list[Any], schema: dict[str, Any], root: Mapping[str, Any]) -> Any:
    prefix = _schema_list(schema.get("prefixItems"))
    rest = schema.get("items")
    if isinstance(rest, list):  # draft-07 tuple form: items is the prefix
        prefix, rest = rest, schema.get("additionalItems")
    out = []
    for index, item in enumerate(value):
        subschema = prefix[index] if index < len(prefix) else rest
        out.append(
            _fill_defaults(item, subschema, root, 0) if isinstance(subschema, dict) else item
        )
    return out


def _default_of(schema: Any, root: Mapping[str, Any], ref_hops: int) -> tuple[bool, Any]:
    """(True, default) when the property schema, or what it refers to, declares a default."""
    if not isinstance(schema, dict):
        return False, None
    if "default" in schema:
        return True, schema["default"]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref_hops < _MAX_REF_HOPS:
        try:
            found, default = _default_of(resolve_local_ref(root, ref), root, ref_hops + 1)
        except LookupError:
            found, default = False, None
        if found:
            return True, default
    for branch in _schema_list(schema.get("allOf")):
        found, default = _default_of(branch, root, ref_hops)
        if found:
            return True, default
    return False, None


def _schema_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
