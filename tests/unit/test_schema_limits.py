"""Bounds on schema work (app.speculation.schema_limits) and RE2 matching in validation."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.speculation.schema_limits import expansion_size, pattern_problem, schema_patterns
from app.speculation.validation import validate_arguments


def doubling_schema(levels: int) -> dict[str, Any]:
    """The issue's schema: level n's allOf lists level n+1's $ref twice (2**levels work)."""
    defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}] * 2}
                            for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/l0"}}, "$defs": defs}


def test_expansion_counts_every_ref_and_branch() -> None:
    flat = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    assert expansion_size(flat, 100) == 3
    # Each level doubles: the count grows with 2**levels (plus the $defs walked once).
    assert expansion_size(doubling_schema(4), 10_000) > 2**5
    assert expansion_size(doubling_schema(5), 10_000) > 2 * expansion_size(doubling_schema(4),
                                                                          10_000) - 10


def test_expansion_stops_at_the_budget_quickly() -> None:
    started = time.perf_counter()
    assert expansion_size(doubling_schema(30), 1000) == 1001
    assert time.perf_counter() - started < 1


def test_recursion_counts_once() -> None:
    tree = {"type": "object", "properties": {"children": {"type": "array",
                                                          "items": {"$ref": "#"}}}}
    # root, children, items -> root again (the ref opens), children, items (not again).
    assert expansion_size(tree, 100) == 6
    loop = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object"}
    assert expansion_size(loop, 100) < 10


def test_schema_patterns_finds_pattern_values_and_pattern_property_keys() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x$"},
                                               "pattern": {"type": "string"}},
              "patternProperties": {"^p_": {"type": "integer"}},
              "$defs": {"d": {"pattern": "[0-9]+"}}}
    assert sorted(schema_patterns(schema)) == ["[0-9]+", "^p_", "^x$"]


@pytest.mark.parametrize("pattern", [
    "^(a+)+$", "(a*)*", r"(\w+\s?)*", "(?:x[a-z]*)+", "(a|aa)+", "(a|a)*", "([a-z]+){2,100}",
])
def test_catastrophic_patterns_are_refused(pattern: str) -> None:
    problem = pattern_problem(pattern, 512)
    assert problem is not None and "catastrophic" in problem


@pytest.mark.parametrize("pattern", [
    "^[a-z]+$", "[0-9]{2}", "(a|b)*c", r"^[\w.-]+@([\w-]+\.)+[\w-]{2,4}$", "([a-z]+,)+",
    "(ab+)*", r"(\d+,)*\d+", "(foo|bar)*", r"^\d{4}-\d{2}-\d{2}$", "(a+b)+",
])
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert pattern_problem(pattern, 512) is None


@pytest.mark.parametrize(("pattern", "needle"), [
    ("((", "not a valid regular expression"),
    (r"(a)\1", "RE2"),
    ("(?=x)y", "RE2"),
    ("a{1001}", "RE2"),
    ("a" * 600, "600 characters"),
])
def test_unsupported_and_long_patterns(pattern: str, needle: str) -> None:
    problem = pattern_problem(pattern, 512)
    assert problem is not None and needle in problem


def test_validation_matches_patterns_in_linear_time() -> None:
    """RE2, not Python's backtracking `re`: a catastrophic pattern against a hostile value
    (which `re` takes hours on) is answered at once, in every keyword that matches."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
              "patternProperties": {"^x(y+)+$": {"type": "integer"}},
              "additionalProperties": False}
    started = time.perf_counter()
    problems = validate_arguments({"a": "a" * 60 + "!", "x" + "y" * 60 + "!": 1}, schema)
    assert time.perf_counter() - started < 1
    assert len(problems) == 2 and "does not match" in problems[1]
    assert validate_arguments({"a": "aaa", "xyy": 3}, schema) == []
    assert validate_arguments({"xyy": "s"}, schema) == ["$.xyy: 's' is not of type 'integer'"]


def test_format_regex_uses_re2() -> None:
    schema = {"type": "object", "properties": {"r": {"type": "string", "format": "regex"}}}
    assert validate_arguments({"r": "^a+$"}, schema) == []
    assert validate_arguments({"r": r"(a)\1"}, schema)
