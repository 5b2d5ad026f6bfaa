"""Bounds on schema work (app.speculation.schema_limits) and RE2 matching in validation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.speculation import schema_limits
from app.speculation.schema_limits import expansion_size, pattern_problem, schema_patterns
from app.speculation.validation import subschema_children, validate_arguments


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


def test_expansion_stops_at_the_budget_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """2**30 subschemas to expand: the count stops after `budget` of them, which is what
    "quickly" means here (counted, not timed)."""
    expanded = 0

    def counted(node: dict[str, Any]) -> Any:
        nonlocal expanded
        expanded += 1
        # Stops a count that ignores its budget at once instead of after hours.
        assert expanded <= 10 * 1000, "the expansion went on past its budget"
        return subschema_children(node)

    monkeypatch.setattr(schema_limits, "subschema_children", counted)
    assert expansion_size(doubling_schema(30), 1000) == 1001
    assert expanded <= 1000


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


def test_validation_matches_patterns_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """RE2, not Python's backtracking `re`: a catastrophic pattern against a hostile value
    (which `re` takes hours on) is answered, in every keyword that matches, without the
    pattern ever reaching `re` (checked by a spy on `re`, not by a clock)."""
    hostile = ("^(a+)+$", "^x(y+)+$")
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": hostile[0]}},
              "patternProperties": {hostile[1]: {"type": "integer"}},
              "additionalProperties": False}
    handed_to_re: list[str] = []

    def spying(original: Any) -> Any:
        def spy(pattern: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(pattern, str) and pattern in hostile:
                handed_to_re.append(pattern)
                # Refused at once: matching it with `re` would take hours.
                raise AssertionError(f"{pattern!r} was handed to Python's re")
            return original(pattern, *args, **kwargs)
        return spy

    for name in ("compile", "search", "match", "fullmatch", "findall", "finditer"):
        monkeypatch.setattr(re, name, spying(getattr(re, name)))
    problems = validate_arguments({"a": "a" * 60 + "!", "x" + "y" * 60 + "!": 1}, schema)
    assert handed_to_re == []
    assert len(problems) == 2 and "does not match" in problems[1]
    assert validate_arguments({"a": "aaa", "xyy": 3}, schema) == []
    assert validate_arguments({"xyy": "s"}, schema) == ["$.xyy: 's' is not of type 'integer'"]


def test_format_regex_uses_re2() -> None:
    schema = {"type": "object", "properties": {"r": {"type": "string", "format": "regex"}}}
    assert validate_arguments({"r": "^a+$"}, schema) == []
    assert validate_arguments({"r": r"(a)\1"}, schema)
