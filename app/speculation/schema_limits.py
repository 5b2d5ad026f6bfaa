"""Bounds on the work a client's JSON Schema can cause, checked before the schema is used.

Bytes and depth (app.api.limits) do not bound the work: a 1 KB schema whose `$defs` level `n`
lists `{"$ref": level n+1}` twice in its `allOf` doubles validation and grammar work per level
(30 levels: hours), and `pattern: "^(a+)+$"` backtracks exponentially in Python's `re`. Here:

- `expansion_size`: subschemas visited when every reference and every `allOf`/`anyOf`/`oneOf`
  branch is expanded, counted up to a budget (a reference already being expanded on the path,
  i.e. recursion, is not expanded again: it is bounded by the data, not by the schema);
- `pattern_problem`: a regex must fit a length cap, compile in RE2 (linear-time matching; the
  server matches patterns with RE2, see app.speculation.validation) and not nest unbounded repeats
  that can split the same text in many ways (`(a+)+`, `(\\w+\\s?)*`): other engines that see
  the schema (a client's validator, the grammar compiler) would backtrack on those;
- `schema_patterns`: every regex of a schema (`pattern` values, `patternProperties` keys).
"""

from __future__ import annotations

import re
import re._constants as sre  # the parser's opcodes; stable across 3.11-3.13
import re._parser as sre_parse
from collections.abc import Iterator
from typing import Any

import re2

from app.speculation.validation import (
    compile_re2,
    iter_subschemas,
    local_references,
    resolve_local_ref,
    subschema_children,
)

# A bounded repeat this long behaves like an unbounded one for backtracking.
_LONG_REPEAT = 16


def expansion_size(schema: Any, budget: int) -> int:
    """Subschemas visited expanding `schema` fully (local `$ref`, `$dynamicRef` and
    `$recursiveRef` followed, except into a reference already open on the same path); stops at
    `budget + 1`. Iterative and bounded by the budget, so the count itself costs at most
    `budget` steps."""
    count = 0
    stack: list[tuple[Any, frozenset[str]]] = [(schema, frozenset())]
    while stack:
        node, open_refs = stack.pop()
        if not isinstance(node, dict):
            continue
        count += 1
        if count > budget:
            return count
        for _, ref in local_references(node):
            if isinstance(ref, str) and ref not in open_refs:
                try:
                    target = resolve_local_ref(schema, ref)
                except LookupError:  # check_schema reports it
                    continue
                stack.append((target, open_refs | {ref}))
        stack.extend((child, open_refs) for child in subschema_children(node))
    return count


def schema_patterns(schema: Any) -> Iterator[str]:
    """Every regex in `schema`: `pattern` values and `patternProperties` keys."""
    for sub in iter_subschemas(schema):
        pattern = sub.get("pattern")
        if isinstance(pattern, str):
            yield pattern
        props = sub.get("patternProperties")
        if isinstance(props, dict):
            yield from (key for key in props if isinstance(key, str))


def pattern_problem(pattern: str, max_chars: int) -> str | None:
    """Why `pattern` is refused, or None."""
    if len(pattern) > max_chars:
        return f"is {len(pattern)} characters long; the limit is {max_chars}"
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return "is not a valid regular expression"
    try:
        compile_re2(pattern)
    except re2.error:
        return ("is not supported: patterns must be RE2 syntax (no backreferences or "
                "lookaround; at most 1000 repetitions)")
    if _ambiguous_repeat(list(tree)):
        return ("nests unbounded repeats that can split the same text many ways (like "
                "'(a+)+'): catastrophic backtracking; repeat a delimited group instead, "
                "like '([a-z]+,)+'")
    return None


def _repeats(op: Any, args: Any) -> bool:
    return op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT) and (
        args[1] == sre.MAXREPEAT or args[1] > _LONG_REPEAT
    )


def _sub_items(op: Any, args: Any) -> list[list[Any]]:
    """The sub-sequences directly inside one parse item."""
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        return [list(args[2])]
    if op == sre.SUBPATTERN:
        return [list(args[3])]
    if op == sre.BRANCH:
        return [list(branch) for branch in args[1]]
    if op == sre.ATOMIC_GROUP:
        return [list(args)]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [list(args[1])]
    if op == sre.GROUPREF_EXISTS:
        return [list(b) for b in args[1:] if b is not None]
    return []


def _open_branch(body: list[Any]) -> bool:
    """An alternation in a repeated body whose alternatives may start alike: `(a|aa)+` (the
    parser makes it `a(|a)`, an empty alternative) or `(ab|ac)*` split one text many ways."""
    for op, args in body:
        if op == sre.BRANCH:
            firsts = [branch[0] if branch else None for branch in args[1]]
            if any(f is None or f[0] != sre.LITERAL for f in firsts):
                return True
            if len({f[1] for f in firsts if f is not None}) != len(firsts):
                return True
        if any(_open_branch(sub) for sub in _sub_items(op, args)):
            return True
    return False


def _ambiguous_repeat(items: list[Any]) -> bool:
    """Whether a repeat in `items` holds another unbounded repeat that is not closed by a
    character it cannot match (`([a-z]+,)+` is fine: each `,` ends one inner run)."""
    for op, args in items:
        if _repeats(op, args) and (
            _has_open_inner_repeat(list(args[2])) or _open_branch(list(args[2]))
        ):
            return True
        if any(_ambiguous_repeat(sub) for sub in _sub_items(op, args)):
            return True
    return False


def _has_open_inner_repeat(body: list[Any]) -> bool:
    for index, (op, args) in enumerate(body):
        if _repeats(op, args):
            # The last item of the body is followed by the next iteration's first one.
            following = body[index + 1] if index + 1 < len(body) else body[0]
            if not _closed_by(list(args[2]), following):
                return True
        elif any(_has_open_inner_repeat(sub) for sub in _sub_items(op, args)):
            return True
    return False


def _closed_by(repeated: list[Any], following: Any) -> bool:
    """The repeated part is one character class and the next item is a literal outside it."""
    if following is None or following[0] != sre.LITERAL or len(repeated) != 1:
        return False
    char = chr(following[1])
    matches = _class_matches(repeated[0], char)
    return matches is False


def _class_matches(item: Any, char: str) -> bool | None:
    """Whether a one-character item matches `char` (None: cannot tell)."""
    op, args = item
    if op == sre.LITERAL:
        return chr(args) == char
    if op == sre.NOT_LITERAL:
        return chr(args) != char
    if op == sre.ANY:
        return char != "\n"
    if op == sre.IN:
        negate = bool(args) and args[0][0] == sre.NEGATE
        found = False
        for sub_op, sub_args in args[1:] if negate else args:
            if sub_op == sre.LITERAL:
                found |= chr(sub_args) == char
            elif sub_op == sre.RANGE:
                found |= sub_args[0] <= ord(char) <= sub_args[1]
            elif sub_op == sre.CATEGORY:
                hit = _category_matches(sub_args, char)
                if hit is None:
                    return None
                found |= hit
            else:
                return None
        return found != negate
    return None


def _category_matches(category: Any, char: str) -> bool | None:
    checks = {
        sre.CATEGORY_DIGIT: char.isdigit(),
        sre.CATEGORY_NOT_DIGIT: not char.isdigit(),
        sre.CATEGORY_WORD: char.isalnum() or char == "_",
        sre.CATEGORY_NOT_WORD: not (char.isalnum() or char == "_"),
        sre.CATEGORY_SPACE: char.isspace(),
        sre.CATEGORY_NOT_SPACE: not char.isspace(),
    }
    return checks.get(category)
