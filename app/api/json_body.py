"""A request body as JSON, strictly: what Python's `json` lets through (or fails on with
something other than a decode error) that a request must not carry, refused with a 400 that
says what and where, before any check or model reads the body.

- **Long integer literals** (more than `MAX_INT_DIGITS` digits): Python refuses more than 4,300
  digits with a `ValueError` the decoder does not wrap, and converting long ones costs
  quadratic time. No field of a request needs more than 20 digits (a 64-bit seed).
- **`NaN`, `Infinity`, `-Infinity`, and numbers too large for a float** (`1e400` would become
  infinity): not JSON (RFC 8259), and nothing downstream (sampling, JSON Schema, the grammar)
  expects them.
- **Duplicate keys in one object**: Python keeps the last one; a proxy or a client library in
  front of the server may act on the first, so the server would run what they did not check.
- **Nesting too deep for the parser** (it raises `RecursionError`).
- **Text that cannot be encoded** (`unencodable_text`): a lone surrogate escape such as
  `"\\ud800"` is valid JSON (and Python's `json` decodes a surrogate's raw UTF-8 bytes too, with
  "surrogatepass"), giving a Python string that every later `.encode()` refuses
  (hashing the prompt for cache-affinity routing, a schema's size in bytes, the tokenizer), far
  from any place that could answer a 400. UTF-8 encodes every other code point, so the lone
  surrogates (U+D800 to U+DFFF) are exactly the strings that cannot be encoded.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from app.api.errors import ApiError

# More digits than any field of a request needs (a seed has at most 20), far below Python's
# own limit of 4,300.
MAX_INT_DIGITS = 100

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class _Refusal:
    """Left by a decoder hook where the refused value was, so the 400 can name its field."""

    message: str
    code: str


class _DuplicateKeys(dict[str, Any]):
    """An object that had a key twice (`refusal` says which)."""

    refusal: _Refusal


def _shown(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def loads_strict(body: bytes | str) -> Any:
    """`body` parsed as JSON, or a 400 for bad JSON and for each case in the module's
    docstring but unencodable text (`check_text`, on the parsed value), naming the field."""
    refused: list[_Refusal] = []

    def integer(literal: str) -> Any:
        digits = len(literal.lstrip("-"))
        if digits <= MAX_INT_DIGITS:
            return int(literal)
        refused.append(_Refusal(f"an integer of {digits} digits; the limit is "
                                f"{MAX_INT_DIGITS}", "number_too_long"))
        return refused[-1]

    def number(literal: str) -> Any:
        value = float(literal)
        if math.isfinite(value):
            return value
        refused.append(_Refusal(f"the number {_shown(literal, 32)}, too large for a 64-bit "
                                "float", "number_too_large"))
        return refused[-1]

    def constant(name: str) -> Any:
        refused.append(_Refusal(f"{name}, which is not JSON (numbers are finite, RFC 8259)",
                                "invalid_number"))
        return refused[-1]

    def mapping(pairs: list[tuple[str, Any]]) -> Any:
        result = dict(pairs)
        if len(result) == len(pairs):
            return result
        seen: set[str] = set()
        twice = ""
        for key, _ in pairs:
            if key in seen:
                twice = key
                break
            seen.add(key)
        duplicated = _DuplicateKeys(result)
        duplicated.refusal = _Refusal(f"the key {_shown(twice)!r} twice in one object",
                                      "duplicate_key")
        refused.append(duplicated.refusal)
        return duplicated

    try:
        data = json.loads(body, parse_int=integer, parse_float=number,
                          parse_constant=constant, object_pairs_hook=mapping)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply to parse",
                       code="body_too_deep") from None
    except ValueError as exc:  # anything else the decoder refuses: still the body's fault
        raise ApiError(400, f"request body is not valid JSON ({type(exc).__name__})") from None
    if refused:
        where, refusal = _locate(data)
        raise ApiError(400, f"{where or 'the request body'} has {refusal.message}",
                       param=where or None, code=refusal.code)
    return data


def _children(item: Any, path: str) -> list[tuple[Any, str]]:
    """The values inside `item` with their paths (`a.b`, `a[0]`), last first."""
    if isinstance(item, dict):
        pairs = [(child, f"{path}.{key}" if path else str(key)) for key, child in item.items()]
    elif isinstance(item, list):
        pairs = [(child, f"{path}[{index}]") for index, child in enumerate(item)]
    else:
        return []
    pairs.reverse()  # popped from a stack: the first child comes out first
    return pairs


def _locate(data: Any) -> tuple[str, _Refusal]:
    """The first refused value in `data`, in document order, with its path ("": the body)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Refusal):
            return path, item
        if isinstance(item, _DuplicateKeys):
            return path, item.refusal
        stack.extend(_children(item, path))
    raise AssertionError("a decoder hook refused a value that is not in the result")


def unencodable_text(value: Any) -> str | None:
    """The path (`messages[0].content`) of the first string in `value`, key or value, that
    cannot be encoded as UTF-8, or None when every one can. A key that cannot be encoded is
    named by its object's path (the key itself could not be shown)."""
    try:  # one search over the whole text, in C, before any walk in Python
        if not _SURROGATE.search(json.dumps(value, ensure_ascii=False, default=str)):
            return None
    except (RecursionError, ValueError):
        pass  # too deep to dump (the body-depth limit refuses it anyway): walk
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "body"
            continue
        if isinstance(item, dict) and any(
                isinstance(key, str) and _SURROGATE.search(key) for key in item):
            return f"{path}[key]" if path else "body[key]"
        stack.extend(_children(item, path))
    return None


def check_text(value: Any) -> None:
    """A 400 naming the string in `value` that cannot be encoded (see the docstring)."""
    where = unencodable_text(value)
    if where is not None:
        shown = _shown(where, 120)
        raise ApiError(400, f"{shown} holds text that cannot be encoded as UTF-8 (a lone "
                       "surrogate such as \\ud800): send a valid Unicode string",
                       param=shown, code="invalid_text")
