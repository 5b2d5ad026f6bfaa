"""Built-in demo tools: offline, deterministic (given the clock), safe to run on any server.

All but `append_note` are idempotent and speculable, so the sidecar's prediction may start them
before the main model commits; `append_note` writes to disk and only ever runs after the commit,
to the calling tenant's own file (`app/tools/call_context.py`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from app.home import model_home
from app.tools.call_context import current_call
from app.tools.registry import tool

# -- calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 500
# Integer results above this many bits (~1233 decimal digits) are refused: `9**9**9` would
# otherwise take minutes and gigabytes before any timeout could fire (the thread cannot be killed).
MAX_INTEGER_BITS = 4096
MAX_ROUND_DIGITS = 15


class CalculatorError(ValueError):
    """The expression is not allowed or has no finite numeric value."""


Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_OPERATOR_NAMES = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
}
# name -> (function, min args, max args)
_FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (round, 1, 2),
    "min": (min, 2, 32),
    "max": (max, 2, 32),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (math.log, 1, 2),
    "log10": (math.log10, 1, 1),
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def evaluate_expression(expression: str) -> Number:
    """Value of an arithmetic expression, computed from its syntax tree (never `eval`).

    Numbers, `+ - * / // % **`, unary minus, parentheses, `pi`, `e` and the functions in
    `_FUNCTIONS`. Anything else (names, attributes, strings, other calls) raises
    `CalculatorError`, as do results that are not finite or too large.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculatorError("expression is too deeply nested") from None
    try:
        return _evaluate(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result is too large") from None
    except RecursionError:
        raise CalculatorError("expression is too deeply nested") from None


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {value!r}")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        operation = _BINARY.get(type(node.op))
        if operation is None:
            symbol = _OPERATOR_NAMES.get(type(node.op), type(node.op).__name__)
            raise CalculatorError(f"operator {symbol} is not supported")
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(operation(left, right))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r} (constants: pi, e)")
    if isinstance(node, ast.Call):
        return _call(node)
    raise CalculatorError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
        known = ", ".join(sorted(_FUNCTIONS))
        target = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        raise CalculatorError(f"unknown function {target!r} (known: {known})")
    name = node.func.id
    function, least, most = _FUNCTIONS[name]
    if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
        raise CalculatorError(f"{name}() takes plain positional arguments only")
    if not least <= len(node.args) <= most:
        count = str(least) if least == most else f"{least} to {most}"
        raise CalculatorError(f"{name}() takes {count} arguments, got {len(node.args)}")
    args = [_evaluate(arg) for arg in node.args]
    if name == "round" and len(args) == 2:
        digits = args[1]
        if not isinstance(digits, int) or abs(digits) > MAX_ROUND_DIGITS:
            raise CalculatorError(f"round() digits must be an integer within ±{MAX_ROUND_DIGITS}")
    try:
        return _checked(function(*args))
    except ValueError as exc:  # math domain errors: sqrt(-1), log(0)
        raise CalculatorError(f"{name}(): {exc}") from None


def _check_power(base: Number, exponent: Number) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > MAX_INTEGER_BITS:
            raise CalculatorError("result is too large")
    elif isinstance(exponent, int) and abs(exponent) > 100_000:
        raise CalculatorError("exponent is too large")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not finite")
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        raise CalculatorError("result is too large")
    assert isinstance(value, int | float)
    return value


@tool(idempotent=True, timeout_s=2.0)
def calculator(
    expression: Annotated[
        str,
        Field(
            max_length=MAX_EXPRESSION_CHARS,
            description="Arithmetic such as '2 * (3 + 4) ** 2 / sqrt(16)'. Supports + - * / // % "
            "**, parentheses, pi, e, sqrt, abs, round, min, max, floor, ceil, exp, log, log10.",
        ),
    ],
) -> Number:
    """Evaluate an arithmetic expression exactly as written and return its numeric value."""
    return evaluate_expression(expression)


# -- unit conversion -------------------------------------------------------------------------

Unit = Literal[
    "mm", "cm", "m", "km", "in", "ft", "yd", "mi",
    "mg", "g", "kg", "t", "oz", "lb",
    "C", "F", "K",
    "ms", "s", "min", "h", "day", "week",
]  # fmt: skip

# unit -> (dimension, size in the dimension's base unit: metre, kilogram, second)
_LINEAR_UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "yd": ("length", 0.9144),
    "mi": ("length", 1609.344),
    "mg": ("mass", 1e-6),
    "g": ("mass", 0.001),
    "kg": ("mass", 1.0),
    "t": ("mass", 1000.0),
    "oz": ("mass", 0.028349523125),
    "lb": ("mass", 0.45359237),
    "ms": ("time", 0.001),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "day": ("time", 86400.0),
    "week": ("time", 604800.0),
}
_TEMPERATURES = ("C", "F", "K")


def _dimension(unit: str) -> str:
    return "temperature" if unit in _TEMPERATURES else _LINEAR_UNITS[unit][0]


def _to_kelvin(value: float, unit: str) -> float:
    if unit == "C":
        return value + 273.15
    if unit == "F":
        return (value - 32.0) * 5.0 / 9.0 + 273.15
    return value


def _from_kelvin(kelvin: float, unit: str) -> float:
    if unit == "C":
        return kelvin - 273.15
    if unit == "F":
        return (kelvin - 273.15) * 9.0 / 5.0 + 32.0
    return kelvin


@tool(idempotent=True, timeout_s=2.0)
def convert_units(
    value: Annotated[float, Field(description="The quantity to convert.")],
    from_unit: Annotated[Unit, Field(description="Unit of `value`.")],
    to_unit: Annotated[Unit, Field(description="Unit to convert to (same dimension).")],
) -> dict[str, Any]:
    """Convert a length, mass, temperature or time value from one unit to another."""
    if not math.isfinite(value):
        raise ValueError("value must be a finite number")
    dimension, target = _dimension(from_unit), _dimension(to_unit)
    if dimension != target:
        raise ValueError(f"cannot convert {dimension} ({from_unit}) to {target} ({to_unit})")
    if dimension == "temperature":
        kelvin = _to_kelvin(value, from_unit)
        if kelvin < -1e-9:
            raise ValueError(f"{value:g} {from_unit} is below absolute zero")
        converted = _from_kelvin(max(kelvin, 0.0), to_unit)
    else:
        converted = value * _LINEAR_UNITS[from_unit][1] / _LINEAR_UNITS[to_unit][1]
    # 12 significant digits: hides binary noise such as 0.30000000000000004.
    return {"value": float(f"{converted:.12g}"), "unit": to_unit, "dimension": dimension}


# -- current time ----------------------------------------------------------------------------

# Replaced in tests; everything else in current_time is a pure function of it.
clock: Callable[[], datetime] = lambda: datetime.now(UTC)  # noqa: E731


@tool(idempotent=True, timeout_s=2.0)
def current_time(
    timezone: Annotated[
        str, Field(max_length=64, description="IANA time zone name, e.g. 'Europe/Paris'.")
    ] = "UTC",
) -> dict[str, Any]:
    """Current date and time in a time zone."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {timezone!r} (use an IANA name like 'Asia/Tokyo')"
        ) from None
    now = clock().astimezone(zone)
    return {
        "timezone": timezone,
        "iso": now.isoformat(timespec="seconds"),
        "utc_offset": now.strftime("%z")[:3] + ":" + now.strftime("%z")[3:],
        "weekday": now.strftime("%A"),
    }


# -- document search -------------------------------------------------------------------------

_STOPWORDS = frozenset(
    "a an and are as at be by can for from how in is it its of on or so such that the their "
    "them then there these this to was what when where which who why with does do".split()
)


def _terms(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    # A crude plural fold ("replicas" finds "replica") is enough for a 16-document corpus.
    return [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        for w in words
        if w not in _STOPWORDS
    ]


class _DocIndex:
    def __init__(self, docs: list[dict[str, str]]) -> None:
        self.docs = docs
        counts = [Counter(_terms(f"{d['title']} {d['title']} {d['text']}")) for d in docs]
        document_frequency = Counter(term for c in counts for term in c)
        total = len(docs)
        self.idf = {
            t: math.log((1 + total) / (1 + df)) + 1.0 for t, df in document_frequency.items()
        }
        self.vectors = [self._weights(c) for c in counts]

    def _weights(self, counts: Counter[str]) -> dict[str, float]:
        raw = {t: (1.0 + math.log(n)) * self.idf.get(t, 0.0) for t, n in counts.items()}
        norm = math.sqrt(sum(w * w for w in raw.values())) or 1.0
        return {t: w / norm for t, w in raw.items()}

    def search(self, query: str, top_k: int) -> list[tuple[float, dict[str, str]]]:
        q = self._weights(Counter(_terms(query)))
        scored = [
            (sum(w * vec.get(t, 0.0) for t, w in q.items()), d)
            for vec, d in zip(self.vectors, self.docs, strict=True)
        ]
        hits = [(round(score, 4), doc) for score, doc in scored if score > 0]
        # Stable sort keeps the corpus order among equal scores: same query, same answer.
        hits.sort(key=lambda hit: -hit[0])
        return hits[:top_k]


@functools.cache
def _doc_index() -> _DocIndex:
    raw = resources.files("app.tools").joinpath("docs.json").read_text(encoding="utf-8")
    return _DocIndex(json.loads(raw))


@tool(idempotent=True, timeout_s=5.0)
def search_docs(
    query: Annotated[str, Field(min_length=1, max_length=500, description="What to look for.")],
    top_k: Annotated[int, Field(ge=1, le=10, description="How many documents to return.")] = 3,
) -> list[dict[str, Any]]:
    """Search a small built-in knowledge base (Ray Serve, vLLM, speculative decoding, JSON
    Schema, MCP, OpenTelemetry, ...) and return the best matching documents."""
    return [
        {"id": doc["id"], "title": doc["title"], "score": score, "text": doc["text"]}
        for score, doc in _doc_index().search(query, top_k)
    ]


# -- notes (the side-effecting tool) ---------------------------------------------------------

_notes_lock = threading.Lock()


def notes_path(tenant: str) -> Path:
    """`tenant`'s own notes file: one per tenant, so no caller reads or fills another's. The
    name is a digest of the tenant, so no tenant name can point outside the folder."""
    digest = hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:32]
    return model_home() / "notes" / f"{digest}.jsonl"


MAX_NOTES_BYTES = 1 << 20  # a tenant's notes file never grows past this


@tool(idempotent=False, speculate="never", timeout_s=5.0)
def append_note(
    text: Annotated[str, Field(min_length=1, max_length=2000, description="The note to keep.")],
) -> dict[str, Any]:
    """Save a note for later. Each call appends one more note."""
    at = clock().isoformat(timespec="seconds")
    line = json.dumps({"at": at, "text": text}, ensure_ascii=False) + "\n"
    path = notes_path(current_call().tenant)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write() on an O_APPEND descriptor: lines from concurrent replicas never interleave.
    data = line.encode("utf-8")
    with _notes_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # A demo tool any caller can reach must not fill the disk.
            if os.fstat(fd).st_size + len(data) > MAX_NOTES_BYTES:
                raise ValueError(f"your notes file is full ({MAX_NOTES_BYTES} bytes); no more "
                                 "notes can be saved")
            os.write(fd, data)
        finally:
            os.close(fd)
    return {"saved": True, "at": at}
