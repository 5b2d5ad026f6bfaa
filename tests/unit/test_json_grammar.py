"""The bounded-whitespace JSON grammar: every style the candidate renderer writes is allowed,
runs of newlines are not."""

import json

import pytest
import xgrammar as xgr

from app.formats.json_grammar import GrammarError, bounded_whitespace_grammar
from app.formats.tool_format import ParsedCall, forced_output_schema, render_forced_variants

accepts = xgr.testing._is_grammar_accept_string

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"},
            "options": {"type": "object", "properties": {
                "units": {"type": "string"},
                "days": {"type": "array", "items": {"type": "integer"}}}}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}}}},
]
CALL = ParsedCall("get_weather", {"city": "Paris", "options": {"units": "c", "days": [1, 2]}})


@pytest.mark.parametrize("named", [None, "get_weather"])
def test_every_rendered_style_is_allowed(named: str | None) -> None:
    grammar = bounded_whitespace_grammar(forced_output_schema(TOOLS, named), 32)
    variants = render_forced_variants([CALL], TOOLS, named)
    assert len(variants) >= 4
    for text in variants:
        assert accepts(grammar, text), text


def test_runs_of_newlines_are_not_allowed() -> None:
    schema = forced_output_schema(TOOLS, "get_weather")
    looping = '{"name": "get_weather", "arguments": {"city": "Paris"\n\n\n\n}}'
    # vLLM's own grammar (any whitespace) lets the model write this...
    any_ws = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True))
    assert accepts(any_ws, looping)
    # ...the bounded one does not: one newline plus indentation per separator.
    bounded = bounded_whitespace_grammar(schema, 32)
    assert not accepts(bounded, looping)
    assert accepts(bounded, looping.replace("\n\n\n\n", "\n"))
    # The model's own styles, measured on BFCL: a blank line before a list's `]`, and a space
    # before a newline.
    assert accepts(bounded, looping.replace("\n\n\n\n", "\n\n"))
    assert accepts(bounded, looping.replace('"Paris"\n\n\n\n', '"Paris" \n'))
    assert not accepts(bounded, looping.replace("\n\n\n\n", "\n\n\n"))


def test_indentation_is_bounded() -> None:
    grammar = bounded_whitespace_grammar({"type": "object"}, 4)
    assert accepts(grammar, '{\n    "a": 1}')
    assert not accepts(grammar, '{\n     "a": 1}')


def test_key_order_follows_the_schema() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"},
                                               "a": {"type": "integer"}},
              "required": ["b", "a"]}
    grammar = bounded_whitespace_grammar(schema, 8)
    assert accepts(grammar, '{"b": 1, "a": 2}')
    assert not accepts(grammar, '{"a": 2, "b": 1}')


def test_a_schema_xgrammar_cannot_compile_is_a_grammar_error() -> None:
    with pytest.raises(GrammarError):
        bounded_whitespace_grammar({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, 8)


def test_features_vllm_refuses_are_refused_too() -> None:
    """An unknown string format: vLLM's own JSON grammar path refuses it
    (has_xgrammar_unsupported_json_features); xgrammar alone would ignore it."""
    schema = {"type": "object", "properties": {"a": {"type": "string",
                                                     "format": "no-such-format"}}}
    with pytest.raises(GrammarError, match="does not support"):
        bounded_whitespace_grammar(schema, 32)
