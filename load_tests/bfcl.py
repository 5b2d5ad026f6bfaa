"""BFCL-style scoring of tool calls, for the benchmark; the cases themselves (loading, the
conversion to OpenAI tools) are the product's `app/datasets/bfcl.py`, whose names this module
also hands on to the benchmark's modules (`__all__`).

Scoring follows BFCL's AST checker (`bfcl_eval/eval_checker/ast_eval/ast_checker.py`, Python
semantics) with two deliberate loosenings, both because calls here come out of JSON:
numbers compare by value (`5.0` is accepted for an integer `5`, as JSON Schema does), and
tuples are lists. Strings compare after BFCL's standardisation: lowercase, with spaces and
`,./-_*^` removed and `'` read as `"`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.datasets.bfcl import (
    BFCL_PACKAGE,
    BFCL_TYPES,
    BFCL_VERSION,
    CORE_CATEGORIES,
    SUPPORTED_CATEGORIES,
    BfclCase,
    bfcl_wheel,
    convert_bfcl_schema,
    load_bfcl,
    ooo_spec_home,
    openai_names,
    to_openai_tools,
)
from app.speculation.canonical import Invocation

__all__ = [
    "BFCL_PACKAGE", "BFCL_TYPES", "BFCL_VERSION", "CORE_CATEGORIES", "SUPPORTED_CATEGORIES",
    "BfclCase", "bfcl_wheel", "convert_bfcl_schema", "load_bfcl", "ooo_spec_home",
    "openai_names", "score_call", "score_calls", "to_openai_tools",
]

# BFCL's standardize_string: these characters are ignored when comparing strings.
_IGNORED_IN_STRINGS = re.compile(r"[ ,./\-_*^]")


# ---------------------------------------------------------------- scoring


def score_call(call_name: str, call_args: Mapping[str, Any], case: BfclCase) -> bool:
    """Whether one call matches one of the case's expected calls (BFCL semantics, see the
    module doc). `call_name` may be the OpenAI or the BFCL name."""
    return any(_matches_entry(call_name, call_args, entry, case) for entry in case.ground_truth)


def score_calls(calls: Sequence[Invocation], case: BfclCase) -> bool:
    """Whether the calls are exactly the expected ones, in any order (BFCL's parallel check).

    Each expected call needs its own matching call; the matching is a full bipartite search,
    not BFCL's greedy pass, so the result does not depend on the order of the calls.
    """
    expected = case.ground_truth
    if len(calls) != len(expected):
        return False
    fits = [
        [
            j
            for j, call in enumerate(calls)
            if _matches_entry(call.name, call.arguments, entry, case)
        ]
        for entry in expected
    ]
    owner: dict[int, int] = {}  # call index -> expected index

    def assign(i: int, seen: set[int]) -> bool:
        for j in fits[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(assign(i, set()) for i in range(len(expected)))


def _matches_entry(
    call_name: str,
    call_args: Mapping[str, Any],
    entry: Mapping[str, Mapping[str, list[Any]]],
    case: BfclCase,
) -> bool:
    ((name, acceptable),) = entry.items()
    if call_name not in (name, case.bfcl_names.get(name)):
        return False
    properties, required = _declared_parameters(case, name)
    if any(param not in call_args for param in required):
        return False
    for param, value in call_args.items():
        if param not in properties or param not in acceptable:
            return False
        if not any(_value_matches(value, option) for option in acceptable[param] if option != ""):
            return False
    return all(param in call_args or "" in options for param, options in acceptable.items())


def _declared_parameters(case: BfclCase, name: str) -> tuple[set[str], list[str]]:
    for tool in case.tools:
        if tool["function"]["name"] == name:
            parameters = tool["function"]["parameters"]
            return set(parameters.get("properties", {})), list(parameters.get("required", []))
    return set(), []


def _value_matches(value: Any, option: Any) -> bool:
    """One value against one acceptable option of the ground truth."""
    if isinstance(option, dict):
        # A dict parameter: {key: [acceptable values]} (BFCL's dict_checker).
        return isinstance(value, dict) and _dict_matches(value, option)
    if isinstance(option, list):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(option)
            and all(_value_matches(v, o) for v, o in zip(value, option, strict=True))
        )
    if isinstance(option, str):
        return isinstance(value, str) and _standardise(value) == _standardise(option)
    if isinstance(option, bool) or isinstance(value, bool):
        return value is option
    if isinstance(option, int | float):
        return isinstance(value, int | float) and value == option
    return bool(value == option)


def _dict_matches(value: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    for key, item in value.items():
        if key not in spec:
            return False
        options = spec[key] if isinstance(spec[key], list) else [spec[key]]
        if not any(_value_matches(item, option) for option in options if option != ""):
            return False
    return all(
        key in value or (isinstance(options, list) and "" in options)
        for key, options in spec.items()
    )


def _standardise(text: str) -> str:
    return _IGNORED_IN_STRINGS.sub("", text).lower().replace("'", '"')
