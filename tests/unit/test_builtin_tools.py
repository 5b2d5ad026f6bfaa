"""Built-in demo tools (app.tools.builtin): calculator safety, units, time, search, notes."""

from __future__ import annotations

import ast
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.tenancy import ANONYMOUS_TENANT
from app.tools import builtin
from app.tools.builtin import CalculatorError, evaluate_expression
from app.tools.call_context import ToolCallContext
from app.tools.registry import ToolRegistry


@pytest.fixture
def registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.load_modules(["app.tools.builtin"])
    return registry


# -- calculator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("-2 ** 2", -4),
        ("(-2) ** 2", 4),
        ("7 // 2 + 7 % 2", 4),
        ("7 / 2", 3.5),
        ("2 ** -1", 0.5),
        ("--3", 3),
        ("+3", 3),
        ("sqrt(16) + abs(-2)", 6.0),
        ("round(3.14159, 2)", 3.14),
        ("round(2.5)", 2),
        ("min(3, 1, 2) + max(4, 5)", 6),
        ("floor(2.7) + ceil(2.1)", 5),
        ("log(e)", 1.0),
        ("log10(1000)", 3.0),
        ("2 * pi", 2 * math.pi),
        ("1e3 + 0.5", 1000.5),
        ("2 ** 64", 2**64),
        (" 1 + 1 ", 2),
    ],
)
def test_calculator_arithmetic(expression: str, value: float) -> None:
    assert evaluate_expression(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("x + 1", "unknown name 'x'"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__('os').system('true')", "unknown function"),
        ("eval('1')", "unknown function 'eval'"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("math.sqrt(4)", "unknown function 'math.sqrt'"),
        ("(1).__class__", "Attribute is not allowed"),
        ("pi.real", "Attribute is not allowed"),
        ("[1, 2][0]", "is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1j * 2", "only numbers are allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("(x := 3)", "NamedExpr is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("round(1.5, ndigits=1)", "plain positional arguments"),
        ("max(*[1, 2])", "plain positional arguments"),
        ("sqrt(1, 2)", "takes 1 arguments, got 2"),
        ("min(1)", "takes 2 to 32 arguments"),
        ("round(1.234, 1.5)", "digits must be an integer"),
        ("2 ^ 3", "use ** for powers"),
        ("1 << 10", "operator << is not supported"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 100000", "too large"),
        ("10 ** 5000", "too large"),
        ("(10 ** 1000) ** 5", "too large"),
        ("2.0 ** 10000", "too large"),
        ("1e308 * 10", "not finite"),
        ("1e999", "not finite"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("sqrt(-1)", "sqrt(): math domain error"),
        ("log(0)", "log(): math domain error"),
        ("1 +", "not an arithmetic expression"),
        ("import os", "not an arithmetic expression"),
        ("1" * 501, "longer than 500"),
        ("(" * 240 + "1" + ")" * 240, "too many nested parentheses"),
        ("2**" * 100 + "2", "too large"),
    ],
)
def test_calculator_rejects_what_is_not_plain_arithmetic(expression: str, fragment: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate_expression(expression)
    assert fragment in str(caught.value)


def test_calculator_bounds_work_per_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each step stays under the integer bound, so the whole expression is cheap; the bound on
    # intermediate results is what prevents a chain of multiplications from growing unbounded.
    # Counted, not timed: the chain stops at the first product over the bound, and no
    # multiplication is ever handed an operand over it.
    operand_bits: list[tuple[int, int]] = []
    multiply = builtin._BINARY[ast.Mult]

    def counted(a: Any, b: Any) -> Any:
        operand_bits.append((int(a).bit_length(), int(b).bit_length()))
        return multiply(a, b)

    monkeypatch.setitem(builtin._BINARY, ast.Mult, counted)
    with pytest.raises(CalculatorError, match="too large"):
        evaluate_expression(" * ".join(["(2 ** 4000)"] * 20))
    assert operand_bits == [(4001, 4001)]


_small_ints = st.integers(min_value=-50, max_value=50).map(lambda n: f"({n})")


@st.composite
def _expressions(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(_small_ints)
    op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]))
    left = draw(_expressions(depth - 1))
    right = draw(_expressions(depth - 1)) if op != "**" else draw(st.integers(0, 4).map(str))
    return f"({left} {op} {right})"


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_calculator_agrees_with_python_or_refuses_cleanly(expression: str) -> None:
    try:
        expected = eval(expression, {"__builtins__": {}})  # noqa: S307 - test oracle on generated ints
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate_expression(expression)
        return
    except OverflowError:
        with pytest.raises(CalculatorError):
            evaluate_expression(expression)
        return
    try:
        value = evaluate_expression(expression)
    except CalculatorError as err:
        # Only the documented refusals: too large, or not a real/finite number.
        assert any(word in str(err) for word in ("too large", "not a real", "not finite"))
        return
    assert value == pytest.approx(expected, rel=1e-12, abs=1e-12)


async def test_calculator_through_the_registry(registry: ToolRegistry) -> None:
    ok = await registry.execute("calculator", {"expression": "2 * (3 + 4) ** 2 / sqrt(16)"})
    assert (ok.is_error, ok.content) == (False, "24.5")
    bad = await registry.execute("calculator", {"expression": "__import__('os')"})
    assert bad.is_error and "CalculatorError: unknown function '__import__'" in bad.content


# -- unit conversion -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "from_unit", "to_unit", "expected"),
    [
        (1, "mi", "km", 1.609344),
        (5, "km", "m", 5000),
        (12, "in", "ft", 1),
        (1, "kg", "lb", 2.20462262185),
        (16, "oz", "lb", 1),
        (100, "C", "F", 212),
        (32, "F", "C", 0),
        (0, "K", "C", -273.15),
        (-40, "F", "C", -40),
        (90, "min", "h", 1.5),
        (2, "week", "day", 14),
        (0.1 + 0.2, "m", "m", 0.3),
    ],
)
def test_convert_units(value: float, from_unit: str, to_unit: str, expected: float) -> None:
    result = builtin.convert_units(value, from_unit, to_unit)  # type: ignore[arg-type]
    assert result["unit"] == to_unit
    assert result["value"] == pytest.approx(expected, rel=1e-11, abs=1e-9)


def test_convert_units_refuses_mismatched_dimensions_and_impossible_values() -> None:
    with pytest.raises(ValueError, match="cannot convert length"):
        builtin.convert_units(1, "km", "kg")
    with pytest.raises(ValueError, match="below absolute zero"):
        builtin.convert_units(-300, "C", "K")
    with pytest.raises(ValueError, match="finite"):
        builtin.convert_units(math.inf, "m", "km")


async def test_convert_units_schema_lists_units(registry: ToolRegistry) -> None:
    spec = registry.get("convert_units")
    assert spec is not None
    units = spec.parameters["properties"]["from_unit"]["enum"]
    assert {"km", "lb", "C", "h"} <= set(units)
    result = await registry.execute(
        "convert_units", {"value": 1, "from_unit": "parsec", "to_unit": "km"}
    )
    assert result.is_error and "'parsec' is not one of" in result.content


# -- current time ----------------------------------------------------------------------------


def test_current_time_is_a_function_of_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin, "clock", lambda: datetime(2025, 7, 1, 12, 0, 0, tzinfo=UTC))
    assert builtin.current_time("Europe/Paris") == {
        "timezone": "Europe/Paris",
        "iso": "2025-07-01T14:00:00+02:00",
        "utc_offset": "+02:00",
        "weekday": "Tuesday",
    }
    assert builtin.current_time()["iso"] == "2025-07-01T12:00:00+00:00"
    assert builtin.current_time("Asia/Kolkata")["utc_offset"] == "+05:30"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "", "/etc/localtime"])
def test_current_time_rejects_unknown_zones(zone: str) -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        builtin.current_time(zone)


# -- search ----------------------------------------------------------------------------------


def test_docs_corpus_is_shipped_and_well_formed() -> None:
    docs = builtin._doc_index().docs
    assert len(docs) >= 15
    assert len({d["id"] for d in docs}) == len(docs)
    assert all(d["title"] and len(d["text"]) > 50 for d in docs)


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("how does speculative decoding verify draft tokens", "speculative-decoding"),
        ("KubeRay RayService on Kubernetes", "kuberay"),
        ("autoscaling replicas ongoing requests", "ray-serve-autoscaling"),
        ("PagedAttention continuous batching", "vllm"),
        ("traces spans OTLP exporter", "opentelemetry"),
        ("readOnlyHint annotations", "mcp"),
        ("is it safe to retry an operation twice", "idempotency"),
    ],
)
def test_search_finds_the_relevant_document(query: str, best: str) -> None:
    hits = builtin.search_docs(query, top_k=3)
    assert hits[0]["id"] == best
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_search_respects_top_k_and_returns_nothing_for_unknown_words() -> None:
    assert len(builtin.search_docs("model serving", top_k=1)) == 1
    assert len(builtin.search_docs("the model", top_k=10)) <= 10
    assert builtin.search_docs("zzzz qqqq") == []
    assert builtin.search_docs("the of and") == []
    assert builtin.search_docs("vLLM KV cache") == builtin.search_docs("vLLM KV cache")


# -- notes (side effects) and the slow tool --------------------------------------------------


async def test_append_note_appends_every_call(
    registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OOO_SPEC_HOME", str(tmp_path / "home"))
    for text in ("first", "first", "second"):
        result = await registry.execute("append_note", {"text": text})
        assert not result.is_error and json.loads(result.content)["saved"] is True
    lines = builtin.notes_path(ANONYMOUS_TENANT).read_text().splitlines()
    assert [json.loads(line)["text"] for line in lines] == ["first", "first", "second"]


async def test_append_note_keeps_each_tenants_notes_apart(
    registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tenant comes from the call's context (never from the arguments, which a client
    writes); the sync tool runs in a thread and still sees it."""
    monkeypatch.setenv("OOO_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(builtin, "MAX_NOTES_BYTES", 200)
    for _ in range(5):  # key-a fills its own file
        await registry.execute("append_note", {"text": "a" * 40}, ToolCallContext("key-a"))
    saved = await registry.execute("append_note", {"text": "b's"}, ToolCallContext("key-b"))
    assert not saved.is_error  # key-a's full file is not key-b's
    a, b = builtin.notes_path("key-a"), builtin.notes_path("key-b")
    assert a != b and a.parent == b.parent == tmp_path / "home" / "notes"
    assert [json.loads(line)["text"] for line in b.read_text().splitlines()] == ["b's"]
    assert all(json.loads(line)["text"] == "a" * 40 for line in a.read_text().splitlines())
    assert not builtin.notes_path(ANONYMOUS_TENANT).exists()
    assert builtin.notes_path("../../etc/passwd").parent == a.parent  # a digest, not a path


async def test_append_note_stops_at_the_size_cap(
    registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OOO_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(builtin, "MAX_NOTES_BYTES", 200)
    results = [await registry.execute("append_note", {"text": "n" * 40}) for _ in range(5)]
    assert [r.is_error for r in results] == [False, False, True, True, True]
    assert "notes file is full" in results[-1].content
    assert builtin.notes_path(ANONYMOUS_TENANT).stat().st_size <= 200


async def test_xdg_cache_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OOO_SPEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert builtin.notes_path("key-a").parent == tmp_path / "ooo-spec" / "notes"


def test_builtin_flags(registry: ToolRegistry) -> None:
    flags = {s.name: (s.idempotent, s.speculate, s.egress) for s in registry.specs()}
    assert flags == {
        "calculator": (True, "always", False),
        "convert_units": (True, "always", False),
        "current_time": (True, "always", False),
        "search_docs": (True, "always", False),
        "append_note": (False, "never", False),
    }
