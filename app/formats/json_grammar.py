"""JSON grammars with bounded whitespace, for forced tool calls and `response_format`.

vLLM's xgrammar backend compiles a JSON schema with "any whitespace": between two JSON tokens
the model may write any run of spaces, tabs and newlines. A small model under that grammar can
write a call's first keys and then only newlines until `max_tokens`, so no call is ever parsed.
vLLM's per-request `whitespace_pattern` is not honoured by the xgrammar backend, so the schema
is turned into an EBNF grammar here (by xgrammar itself) with one change: every whitespace run
becomes `ws`: at most one space or tab, then optionally one or two newlines followed by an
indentation of at most `max_indent` spaces or tabs. That keeps every style the model is seen to
write (one line, one key per line, indent 2 or 4: `tool_format.STYLES`; a blank line before a
list's closing `]` and a space before a newline, both measured on BFCL with SmolLM2:
load_tests/whitespace_runaway.py) and forbids longer runs of newlines.

Plain and speculative decoding of a request get the same grammar text, so they stay identical.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

# How xgrammar writes "any whitespace" in the EBNF it generates from a JSON schema.
_ANY_WS = "[ \\n\\r\\t]*"
_WS_RULE = "ooo_ws"
# Only the rule definitions' left-hand sides start a line.
_RULE_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::=", re.MULTILINE)


class GrammarError(ValueError):
    """The schema cannot be turned into a grammar (the request's fault: a 400)."""


def bounded_whitespace_grammar(schema: dict[str, Any], max_indent: int) -> str:
    r"""EBNF for JSON matching `schema`, whitespace bounded as the module docstring says.

    >>> g = bounded_whitespace_grammar({"type": "object"}, 8)
    >>> [line for line in g.splitlines() if line.startswith('ooo_ws')]
    ['ooo_ws ::= ([ \\t]{0,1} ("" | "\\n" "\\n"{0,1} [ \\t]{0,8}))']
    """
    # Key order matters: the grammar writes properties in the schema's order.
    return _grammar(json.dumps(schema), max_indent)


@lru_cache(maxsize=256)
def _grammar(schema_json: str, max_indent: int) -> str:
    import xgrammar as xgr  # vLLM's structured-output backend; heavy, so imported late
    from vllm.v1.structured_output.backend_xgrammar import (
        has_xgrammar_unsupported_json_features,
    )

    # vLLM refuses these for its own JSON grammar (xgrammar would silently ignore them, e.g.
    # an unknown string `format`): the bounded grammar refuses the same schemas.
    if has_xgrammar_unsupported_json_features(json.loads(schema_json)):
        raise GrammarError("the schema uses JSON Schema features the grammar backend "
                           "(xgrammar) does not support")
    try:
        ebnf = str(xgr.Grammar.from_json_schema(schema_json, any_whitespace=True))
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError for bad schemas
        raise GrammarError(f"the schema cannot be compiled into a grammar: {exc}") from None
    return bound_whitespace(ebnf, max_indent)


def bound_whitespace(ebnf: str, max_indent: int, one_line: bool = False) -> str:
    """`ebnf` (as xgrammar prints a grammar) with every "any whitespace" run bounded as the
    module docstring says; also for the grammar of a structural tag
    (app/formats/structural_tag.py), whose JSON arguments xgrammar writes the same way.
    `one_line`: no newlines at all, only the one space or tab."""
    if _WS_RULE in set(_RULE_NAME.findall(ebnf)):
        raise GrammarError(f"the generated grammar already defines '{_WS_RULE}'")
    body = ebnf.replace(_ANY_WS, _WS_RULE)
    rule = f'{_WS_RULE} ::= ([ \\t]{{0,1}} ("" | "\\n" "\\n"{{0,1}} [ \\t]{{0,{max_indent}}}))'
    if one_line:
        rule = f'{_WS_RULE} ::= [ \\t]{{0,1}}'
    return f"{body.rstrip()}\n{rule}\n"
