"""Forced and strict calls in the model's own format (issue 41, item 4): vLLM's structural tag
of the format constrains them, the drafts are written as the tag lets the model write them,
and the format's parser reads the output back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import AppConfig, EngineConfig
from app.formats.grammar_check import GrammarCheck
from app.formats.json_grammar import GrammarError
from app.formats.structural_tag import (
    ONE_LINE_ARGUMENTS,
    STRUCTURAL_TAG_MODELS,
    call_tag,
    engine_tag_model,
    structural_tag_model,
    tag_grammar,
    wants_tag,
)
from app.formats.tool_format import placeholder_call, render_tagged_variants
from app.formats.tool_formats import ParsedCall, get_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def accepts(grammar: str, text: str) -> bool:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    return bool(_is_grammar_accept_string(xgr.Grammar.from_ebnf(grammar), text))


def test_the_table_is_vllms_own() -> None:
    """Every entry is the `structural_tag_model` of vLLM's parser class of that name, and one
    vLLM's registry can build (hy_v4 is left out on purpose: module docstring)."""
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.structural_tag_registry import (
        _VLLM_STRUCTURAL_TAG_REGISTRY,
        SUPPORTED_STRUCTURAL_TAG_MODELS,
    )

    for parser, model in STRUCTURAL_TAG_MODELS.items():
        assert ToolParserManager.get_tool_parser(parser).structural_tag_model == model, parser
        assert model in SUPPORTED_STRUCTURAL_TAG_MODELS | set(_VLLM_STRUCTURAL_TAG_REGISTRY)
    for parser in ("mistral", "pythonic", "llama4_pythonic"):  # formats with JSON fallback
        assert ToolParserManager.get_tool_parser(parser).structural_tag_model is None
        assert structural_tag_model(parser) is None
    # gpt-oss's tag is built by vLLM's harmony parser module, which registers it on import.
    assert STRUCTURAL_TAG_MODELS["openai"] == "harmony"
    assert "harmony" not in SUPPORTED_STRUCTURAL_TAG_MODELS
    import vllm.parser.harmony  # noqa: F401

    assert "harmony" in _VLLM_STRUCTURAL_TAG_REGISTRY


@pytest.mark.parametrize(("mode", "tools", "parallel", "level", "wanted"), [
    ("required", [WEATHER], None, "auto", True),
    ("named", [WEATHER], None, "auto", True),
    ("none", [WEATHER], None, "parameter", False),
    ("auto", [WEATHER], None, "auto", False),
    ("auto", [WEATHER], False, "auto", True),  # vLLM: one call only needs the envelope
    ("auto", [WEATHER], None, "function", True),
    ("auto", [{"type": "function", "function": {**WEATHER["function"], "strict": True}}],
     None, "auto", True),
])
def test_when_a_tag_applies(mode: str, tools: list[dict[str, Any]], parallel: bool | None,
                            level: Any, wanted: bool) -> None:
    assert wants_tag(mode, tools, parallel, level) is wanted


def test_the_engine_config_chooses_the_tag_or_the_json_fallback() -> None:
    assert engine_tag_model(EngineConfig()) == "hermes"
    assert engine_tag_model(EngineConfig(tool_format="llama3_json")) == "llama"
    assert engine_tag_model(EngineConfig(tool_format="pythonic")) is None
    assert engine_tag_model(EngineConfig(tool_format="openai")) == "harmony"
    assert engine_tag_model(EngineConfig(tool_structural_tags=False)) is None


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
@pytest.mark.parametrize("named", [None, "get_weather"])
def test_drafts_fit_the_tag_and_parse_back(fmt: str, named: str | None) -> None:
    """Every text drafted for a forced call is one the tag's grammar lets the model write,
    and the format's parser reads the call back; a JSON-list output is refused."""
    model = structural_tag_model(get_format(fmt).vllm_parser)
    assert model is not None
    tools = [WEATHER, TIME]
    grammar = tag_grammar(call_tag(model, tools, "named" if named else "required", named,
                                   None, "auto"), 8)
    call = ParsedCall("get_weather", {"days": 3, "city": "Zürich \"old\" town"})
    variants = render_tagged_variants(get_format(fmt), [call], tools)
    assert variants
    for text in variants:
        assert accepts(grammar, text), text
        [parsed] = get_format(fmt).parse(text).calls
        assert parsed == ParsedCall("get_weather", {"city": "Zürich \"old\" town", "days": 3})
    assert not accepts(grammar, json.dumps([{"name": "get_weather",
                                              "arguments": {"city": "x"}}]))
    # Schema drafts (placeholders) fit too: keys and markers as the model will write them.
    for text in render_tagged_variants(get_format(fmt), [placeholder_call(WEATHER)], tools):
        assert accepts(grammar, text), text


@pytest.mark.parametrize("named", [None, "get_weather"])
def test_harmony_calls_are_forced_in_harmony(named: str | None) -> None:
    """gpt-oss (`openai`) is forced through vLLM's harmony tag, as `vllm serve` does: the
    call ooo-spec drafts is harmony the tag lets the model write (its `<|call|>` is a stop
    token there, which the engine takes where the grammar may end), after an analysis
    message too, and vLLM's parser reads it back; the JSON fallback's list is refused."""
    from app.formats.tool_formats.families import FAMILIES
    from tests.unit.test_tool_formats_vllm import family_tokenizer

    fmt = get_format("openai", family_tokenizer("openai"), FAMILIES["openai"].template_text())
    tools = [WEATHER, TIME]
    grammar = tag_grammar(call_tag("harmony", tools, "named" if named else "required", named,
                                   None, "auto"), 8)
    call = ParsedCall("get_weather", {"days": 3, "city": "Zürich \"old\" town"})
    variants = render_tagged_variants(fmt, [call], tools)
    assert variants
    for text in variants:
        written = text.removesuffix("<|call|>")
        for output in (written, "<|channel|>analysis<|message|>Weather: ask the tool.<|end|>"
                       "<|start|>assistant" + written):
            assert accepts(grammar, output), output
            assert fmt.parse(output).calls == [ParsedCall("get_weather", {
                "city": "Zürich \"old\" town", "days": 3})]
    assert not accepts(grammar, json.dumps([{"name": "get_weather",
                                              "arguments": {"city": "x"}}]))
    other = fmt.render([ParsedCall("get_time", {"zone": "UTC"})]).removesuffix("<|call|>")
    assert accepts(grammar, other) is (named is None)  # a named tool: only that one


def test_forced_arguments_follow_the_schema_and_one_call_unless_parallel() -> None:
    grammar = tag_grammar(call_tag("hermes", [WEATHER], "required", None, None, "auto"), 8)
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammar, one)
    assert not accepts(grammar, one.replace('"city"', '"town"'))  # pinned, unlike vLLM's auto
    assert not accepts(grammar, one + one)
    parallel = tag_grammar(call_tag("hermes", [WEATHER], "required", None, True, "auto"), 8)
    assert accepts(parallel, one + one)


def test_auto_strictness_pins_only_strict_tools_arguments() -> None:
    strict = {"type": "function", "function": {**TIME["function"], "strict": True}}
    grammar = tag_grammar(call_tag("hermes", [WEATHER, strict], "auto", None, None, "auto"), 8)
    text = ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"town": 1}}\n'
            '</tool_call>')
    assert accepts(grammar, text)  # not strict: the envelope only
    assert accepts(grammar, "No call needed.")
    assert not accepts(grammar, text.replace('get_weather", "arguments": {"town": 1}',
                                             'get_time", "arguments": {"tz": 1}'))


def test_whitespace_is_bounded_as_in_the_json_grammars() -> None:
    grammar = tag_grammar(call_tag("hermes", [WEATHER], "named", "get_weather", None, "auto"), 4)
    head = '<tool_call>\n{"name": "get_weather", "arguments": {'
    assert accepts(grammar, head + '\n    "city": "x"\n}}\n</tool_call>')
    assert not accepts(grammar, head + '\n\n\n\n"city": "x"}}\n</tool_call>')


def test_a_schema_the_tag_cannot_take_is_the_requests_fault() -> None:
    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}
    with pytest.raises(GrammarError):
        tag_grammar(call_tag("hermes", [broken], "required", None, None, "auto"), 8)


async def test_the_grammar_check_compiles_a_structural_tag() -> None:
    """`structured_tag` (the tag itself, `main.json_max_indent: null`) goes through the check
    pool like any grammar (the replica builds the vocabulary from its tokenizer)."""
    import xgrammar as xgr

    from app.formats.grammar_check import check_pool

    info = xgr.TokenizerInfo(["<tool_call>", "{", "}", '"', "a", "\n", " "])
    check = GrammarCheck(info, 5.0, 5.0, check_pool(AppConfig().limits, "t"))
    compiled: list[str] = []
    real = check._compile

    def compile_(kind: Any, text: str) -> None:
        compiled.append(kind)
        real(kind, text)

    check._compile = compile_  # type: ignore[method-assign]
    tag = call_tag("hermes", [WEATHER], "required", None, None, "auto")
    await check.check_sampling({"structured_tag": tag}, "tenant")
    await check.check_sampling({"structured_tag": tag}, "tenant")  # remembered: not again
    assert compiled == ["structural_tag"]
    assert xgr.GrammarCompiler(info).compile_structural_tag(tag)  # what the check compiles


async def test_the_main_model_forces_hermes_calls_in_their_own_format() -> None:
    """A forced call: the engine gets the tag's grammar, the schema drafts are written as the
    tag lets the model write, and the output is read by the hermes parser; with the tags off,
    the JSON fallback as before."""
    from tests.unit.fake_engine import FakeEngine
    from tests.unit.test_services import CALL, chat, drafts_arrived, main_service, run

    engine = FakeEngine([CALL[:30], CALL[30:]], gate=drafts_arrived)
    service = main_service(engine)
    _, result = await run(service, chat(tool_choice="required"))
    [(_, sampling)] = engine.requests
    assert "<tool_call>" in sampling["structured_grammar"]
    assert [(c.name, c.arguments) for c in result.calls] == [("get_weather", {"city": "Paris"})]
    assert result.content is None
    drafted = [text for _, texts in engine.store.added for text in texts]
    schema = '<tool_call>\n{"name": "get_weather", "arguments": {"city": ""}}\n</tool_call>'
    assert schema in drafted
    # Its draft stops at the city's value, which the schema leaves open.
    assert engine.store.stops[schema] == (schema.index('""') + 1,)

    engine = FakeEngine(['[{"name": "get_weather", "arguments": {"city": "Paris"}}]'])
    service = main_service(engine, main={"engine": {"tool_structural_tags": False}})
    _, result = await run(service, chat(tool_choice="required"))
    [(_, sampling)] = engine.requests
    assert "<tool_call>" not in sampling["structured_grammar"]
    assert [c.name for c in result.calls] == ["get_weather"]

    # `main.json_max_indent: null`: the tag itself, which the engine hands to xgrammar.
    engine = FakeEngine([CALL])
    service = main_service(engine, main={"json_max_indent": None})
    await run(service, chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    [(_, sampling)] = engine.requests
    assert json.loads(sampling["structured_tag"])["type"] == "structural_tag"


def test_a_forced_call_in_the_format_streams_as_the_formats_calls() -> None:
    """The router reads a forced call written in the model's format as the format's calls
    (the JSON fallback's list reader would find none in `<tool_call>` text)."""
    from app.api.streaming import output_stream
    from tests.unit.test_services import CALL, chat

    request = chat(tool_choice="required")
    stream = output_stream(request, get_format("hermes"), None, forced_in_format=True)
    assert stream is not None
    deltas = [stream.feed(CALL[:20]), stream.feed(CALL[20:])]
    names = [c.name for d in deltas for c in d.calls if c.name]
    assert names == ["get_weather"] and not any(d.content for d in deltas)
    json_stream = output_stream(request, get_format("hermes"), None)
    assert json_stream is not None
    assert not any(c.name for c in json_stream.feed(CALL).calls)


def test_deepseek_forced_calls_stay_on_one_line_where_vllms_parser_reads_them() -> None:
    """vLLM's deepseek_v31 parser finds no call whose arguments span lines (its regex stops
    at a newline) and drops the text too; the forced call's grammar keeps the arguments on
    one line, where it reads them (if vLLM's parser learns newlines, the first assertion
    fails and `ONE_LINE_ARGUMENTS` can go)."""
    from app.formats.tool_formats import ParsedOutput
    from app.formats.tool_formats.vllm_parsing import VllmParsing
    from tests.unit.test_tool_formats_vllm import family_tokenizer

    parsing = VllmParsing("deepseek_v31", None, family_tokenizer("deepseek_v31"))

    def written(arguments: str) -> str:
        return ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                + arguments + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")

    lines, line = written('{\n  "city": "Paris"\n}'), written('{"city": "Paris"}')
    assert parsing.parse(lines, [WEATHER]) == (None, ParsedOutput(content=None, calls=[]))
    assert parsing.parse(line, [WEATHER])[1].calls == [ParsedCall("get_weather",
                                                                  {"city": "Paris"})]
    assert "deepseek_v3_1" in ONE_LINE_ARGUMENTS
    grammar = tag_grammar(call_tag("deepseek_v3_1", [WEATHER], "required", None, None,
                                   "auto"), 8, one_line=True)
    assert accepts(grammar, line) and not accepts(grammar, lines)
    assert accepts(tag_grammar(call_tag("deepseek_v3_1", [WEATHER], "required", None, None,
                                        "auto"), 8), lines)
