"""Canonical form and equality of tool invocations (app.speculation.canonical)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.speculation.canonical import (
    Invocation,
    canonical_arguments,
    canonical_invocation,
    canonical_value,
    multiset_match,
)

BOOKING: dict[str, Any] = {
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age_group": {"type": "string", "enum": ["adult", "child"], "default": "adult"},
            },
            "required": ["name"],
        },
        "Options": {
            "type": "object",
            "properties": {
                "breakfast": {"type": "boolean", "default": False},
                "late_checkout": {"type": "boolean", "default": False},
            },
        },
    },
    "type": "object",
    "properties": {
        "hotel": {"type": "string"},
        "nights": {"type": "integer", "default": 1},
        "currency": {"type": "string", "enum": ["EUR", "USD"], "default": "EUR"},
        "guests": {"type": "array", "items": {"$ref": "#/$defs/Guest"}},
        "options": {"$ref": "#/$defs/Options", "default": {}},
        "room": {
            "type": "object",
            "properties": {
                "kind": {"type": "string", "default": "double"},
                "floor": {"type": "integer"},
            },
        },
        "contact": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"email": {"type": "string"}, "verified": {"default": False}},
                    "required": ["email"],
                },
                {"type": "null"},
            ]
        },
    },
    "required": ["hotel"],
}


def test_defaults_are_filled_at_the_top() -> None:
    assert canonical_arguments({"hotel": "Ritz"}, BOOKING) == {
        "currency": "EUR",
        "hotel": "Ritz",
        "nights": 1,
        "options": {"breakfast": False, "late_checkout": False},
    }


def test_defaults_are_filled_in_nested_objects_arrays_and_through_refs() -> None:
    args = {
        "hotel": "Ritz",
        "room": {"floor": 3},
        "guests": [{"name": "Ann"}, {"name": "Bo", "age_group": "child"}],
        "options": {"breakfast": True},
        "contact": {"email": "a@b.c"},
    }
    out = canonical_arguments(args, BOOKING)
    assert out["room"] == {"floor": 3, "kind": "double"}
    assert out["guests"] == [
        {"age_group": "adult", "name": "Ann"},
        {"age_group": "child", "name": "Bo"},
    ]
    assert out["options"] == {"breakfast": True, "late_checkout": False}
    assert out["contact"] == {"email": "a@b.c", "verified": False}  # the one matching anyOf branch


def test_null_branch_gets_no_defaults() -> None:
    assert canonical_arguments({"hotel": "Ritz", "contact": None}, BOOKING)["contact"] is None


def test_ambiguous_any_of_fills_nothing() -> None:
    schema = {
        "type": "object",
        "properties": {
            "x": {
                "anyOf": [
                    {"type": "object", "properties": {"a": {"default": 1}}},
                    {"type": "object", "properties": {"b": {"default": 2}}},
                ]
            }
        },
    }
    assert canonical_arguments({"x": {}}, schema) == {"x": {}}


def test_given_values_win_over_defaults_and_input_is_not_modified() -> None:
    args = {"hotel": "Ritz", "nights": 4, "guests": [{"name": "Ann"}]}
    before = copy.deepcopy(args)
    assert canonical_arguments(args, BOOKING)["nights"] == 4
    assert args == before


def test_filled_default_values_are_copies() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"tags": {"type": "array", "default": []}},
    }
    first = canonical_arguments({}, schema)
    first["tags"].append("x")
    assert canonical_arguments({}, schema) == {"tags": []}
    assert schema["properties"]["tags"]["default"] == []


def test_prefix_items_get_their_own_defaults() -> None:
    schema = {
        "type": "object",
        "properties": {
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "object", "properties": {"a": {"default": 1}}}],
                "items": {"type": "object", "properties": {"b": {"default": 2}}},
            }
        },
    }
    assert canonical_arguments({"pair": [{}, {}, {}]}, schema) == {
        "pair": [{"a": 1}, {"b": 2}, {"b": 2}]
    }


def test_recursive_schema_fills_at_every_depth_and_ref_cycles_terminate() -> None:
    tree = {
        "type": "object",
        "properties": {
            "label": {"type": "string", "default": "node"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
    }
    assert canonical_arguments({"children": [{"children": [{}]}]}, tree) == {
        "children": [{"children": [{"label": "node"}], "label": "node"}],
        "label": "node",
    }
    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert canonical_arguments({"x": 1}, cycle) == {"x": 1}


def test_defaults_from_allof_and_additional_properties() -> None:
    schema = {
        "type": "object",
        "allOf": [{"properties": {"a": {"default": "A"}}}],
        "additionalProperties": {"type": "object", "properties": {"on": {"default": True}}},
    }
    assert canonical_arguments({"x": {}, "y": {"on": False}}, schema) == {
        "a": "A",
        "x": {"on": True},
        "y": {"on": False},
    }


def test_numbers_compare_by_value_but_bools_and_strings_do_not() -> None:
    assert canonical_value({"a": 1.0, "b": [2.0, 2.5], "c": -0.0}) == {
        "a": 1,
        "b": [2, 2.5],
        "c": 0,
    }
    assert canonical_value(True) is True
    assert canonical_value(1) is not True
    ones = [Invocation(name="f", arguments={"x": v}) for v in (1, 1.0, True, "1")]
    keys = [canonical_invocation(inv) for inv in ones]
    assert keys[0] == keys[1]
    assert len({keys[1], keys[2], keys[3]}) == 3


def test_strings_compare_exactly() -> None:
    a = Invocation(name="f", arguments={"city": "Paris"})
    for other in ("paris", "Paris ", "Pаris"):  # the last one has a Cyrillic 'а'
        assert canonical_invocation(a) != canonical_invocation(
            Invocation(name="f", arguments={"city": other}))


def test_canonical_invocation_is_compact_sorted_json() -> None:
    inv = Invocation(name="get_weather", arguments={"unit": "c", "city": "Zürich", "n": 2.0})
    text = canonical_invocation(inv)
    assert text == '{"arguments":{"city":"Zürich","n":2,"unit":"c"},"name":"get_weather"}'
    assert json.loads(text) == {
        "arguments": {"city": "Zürich", "n": 2, "unit": "c"},
        "name": "get_weather",
    }


def test_default_makes_omitted_and_explicit_equal() -> None:
    short = Invocation(name="book", arguments={"hotel": "Ritz"})
    full = Invocation(
        name="book",
        arguments={
            "options": {"late_checkout": False},
            "currency": "EUR",
            "nights": 1.0,
            "hotel": "Ritz",
        },
    )
    assert canonical_invocation(short, BOOKING) == canonical_invocation(full, BOOKING)
    # Without the schema there are no defaults.
    assert canonical_invocation(short) != canonical_invocation(full)
    assert canonical_invocation(short, BOOKING) != canonical_invocation(
        Invocation(name="book2", arguments={"hotel": "Ritz"}), BOOKING)


def test_non_json_values_are_rejected() -> None:
    with pytest.raises(TypeError):
        canonical_value({"a": {1, 2}})


# ---------------------------------------------------------------- multiset matching


def _inv(name: str, **arguments: Any) -> Invocation:
    return Invocation(name=name, arguments=arguments)


def test_parallel_calls_match_in_any_order() -> None:
    candidates = [_inv("w", city="Oslo"), _inv("w", city="Rome", unit="c")]
    committed = [_inv("w", unit="c", city="Rome"), _inv("w", city="Oslo")]
    result = multiset_match(candidates, committed, {})
    assert result.complete
    assert result.pairs == [(1, 0), (0, 1)]


def test_multiset_counts_duplicates() -> None:
    schemas = {"w": {"type": "object", "properties": {"unit": {"default": "c"}}}}
    candidates = [_inv("w", city="Oslo"), _inv("w", city="Oslo", unit="c")]
    committed = [_inv("w", city="Oslo"), _inv("w", city="Oslo"), _inv("w", city="Oslo")]
    result = multiset_match(candidates, committed, schemas)
    assert result.pairs == [(0, 0), (1, 1)]
    assert result.unmatched_committed == [2]
    assert result.unmatched_candidates == []
    assert not result.complete


def test_multiset_reports_leftovers_on_both_sides() -> None:
    candidates = [_inv("a", x=1), _inv("b", y=2), _inv("c")]
    committed = [_inv("b", y=2.0), _inv("a", x=2)]
    result = multiset_match(candidates, committed, {"a": None})
    assert result.pairs == [(1, 0)]
    assert result.unmatched_candidates == [0, 2]
    assert result.unmatched_committed == [1]
    assert multiset_match([], [], {}).complete


# ---------------------------------------------------------------- properties

_keys = st.text(min_size=0, max_size=6)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)
_arguments = st.dictionaries(_keys, _json, max_size=5)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _ints_as_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _ints_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints_as_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # exact: |value| <= 2**53
    return value


@settings(max_examples=200, deadline=None)
@given(_arguments, st.integers())
def test_key_order_does_not_change_the_canonical_form(arguments: dict[str, Any], seed: int) -> None:
    shuffled = _shuffled(arguments, random.Random(seed))
    for schema in (None, BOOKING):
        original = canonical_invocation(Invocation(name="f", arguments=arguments), schema)
        assert original == canonical_invocation(Invocation(name="f", arguments=shuffled), schema)


@settings(max_examples=200, deadline=None)
@given(_arguments)
def test_integral_floats_equal_their_ints(arguments: dict[str, Any]) -> None:
    a = Invocation(name="f", arguments=arguments)
    b = Invocation(name="f", arguments=_ints_as_floats(arguments))
    assert canonical_invocation(a) == canonical_invocation(b)


@settings(max_examples=200, deadline=None)
@given(_arguments)
def test_canonical_form_is_idempotent_and_round_trips(arguments: dict[str, Any]) -> None:
    once = canonical_arguments(arguments, BOOKING)
    assert canonical_arguments(once, BOOKING) == once
    text = canonical_invocation(Invocation(name="f", arguments=arguments), BOOKING)
    again = canonical_invocation(
        Invocation(name="f", arguments=json.loads(text)["arguments"]), BOOKING
    )
    assert text == again
