"""Tool formats against vLLM's own tool parsers of the same name.

Round trip: a call rendered by a format and parsed by vLLM's parser (constructed with the
embedded model's tokenizer, called as vLLM's server calls it) gives back the same invocation,
for every whitespace variant. Agreement: on texts shaped like model outputs (prose, markers,
broken JSON), the format's own parser finds the same calls as vLLM's.

vLLM's `llama3_json` and `mistral` parsers refuse a tokenizer without their special token
(`<|python_tag|>`, `[TOOL_CALLS]`); SmolLM2 has neither, so those two run with a copy of its
tokenizer with the token added, which is what a Llama or Mistral tokenizer has.
"""

from __future__ import annotations

import copy
import json
import keyword
import logging
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.config import EngineConfig
from app.formats.tool_formats import FORMATS, ParsedCall, get_format

SPECIAL_TOKEN = {"llama3_json": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}


@cache
def _hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


@cache
def tokenizer() -> Any:
    """The embedded tokenizer as vLLM's server hands it to parsers: wrapped so the vocabulary
    is read once (a parser reads it three times as it is made; unwrapped that is ~0.1 s)."""
    from vllm.tokenizers.hf import get_cached_tokenizer

    return get_cached_tokenizer(_hf_tokenizer())


@cache
def vllm_parser(name: str) -> Any:
    from vllm.tool_parsers import ToolParserManager

    logging.getLogger("vllm").setLevel(logging.CRITICAL)  # parse failures are logged loudly
    return ToolParserManager.get_tool_parser(name)


@cache
def vllm_request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    )


def vllm_calls(name: str, text: str) -> list[tuple[str, Any]] | None:
    """vLLM's calls for `text` (a fresh parser per output, as the server makes one per
    request); None when vLLM finds no call."""
    tok = _special_tokenizer(name) if name in SPECIAL_TOKEN else tokenizer()
    parser = vllm_parser(name)(tok)
    result = parser.extract_tool_calls(text, vllm_request())
    if not result.tools_called:
        return None
    return [(c.function.name, _as_object(json.loads(c.function.arguments)))
            for c in result.tool_calls]


def _as_object(arguments: Any) -> Any:
    """A known, deliberate difference: arguments that are not a JSON object (a weak model's
    `"arguments": []`) are read as no arguments here, while vLLM passes them on as they are
    (a call whose arguments are not an object is invalid for every tool schema anyway)."""
    return arguments if isinstance(arguments, dict) else {}


@cache
@cache
def _special_tokenizer(name: str) -> Any:
    from vllm.tokenizers.hf import get_cached_tokenizer

    tok = copy.deepcopy(_hf_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": [SPECIAL_TOKEN[name]]})
    return get_cached_tokenizer(tok)


def vllm_content(name: str, text: str) -> str | None:
    tok = _special_tokenizer(name) if name in SPECIAL_TOKEN else tokenizer()
    content: str | None = vllm_parser(name)(tok).extract_tool_calls(text, vllm_request()).content
    return content


def own_calls(name: str, text: str) -> list[tuple[str, Any]] | None:
    parsed = get_format(name).parse(text)
    return [(c.name, c.arguments) for c in parsed.calls] or None


# ----- JSON-Schema-shaped invocations -----------------------------------------------------
identifiers = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,15}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("true", "false", "null")
)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
           | st.floats(allow_nan=False, allow_infinity=False) | texts)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
calls = st.builds(ParsedCall, identifiers, st.dictionaries(identifiers, values, max_size=4))
call_lists = st.lists(calls, min_size=1, max_size=3)


def _clean(name: str, invocation: list[ParsedCall]) -> None:
    """Strings that would end a call early in its own format are out of scope."""
    blob = json.dumps([c.arguments for c in invocation], ensure_ascii=False)
    assume("</tool_call>" not in blob and "[TOOL_CALLS]" not in blob)


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invocation=call_lists)
def test_vllm_parses_every_rendered_variant_back(name: str, invocation: list[ParsedCall]) -> None:
    _clean(name, invocation)
    fmt = get_format(name)
    expected = [(c.name, c.arguments) for c in invocation]
    for text in fmt.render_variants(invocation):
        assert vllm_calls(name, text) == expected, text
        assert own_calls(name, text) == expected, text
        assert fmt.call_start(text) == 0


# ----- agreement on output-shaped texts ---------------------------------------------------
PROSE = st.sampled_from(["", "Sure.", "Let me check.\n", "I can't help with that.", " ", "\n"])


@st.composite
def outputs(draw: st.DrawFn, name: str) -> str:
    """Prose, rendered calls, cut-off calls and stray markers, glued together."""
    fmt = get_format(name)
    pieces: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["prose", "call", "cut", "marker", "junk"]))
        if kind == "prose":
            pieces.append(draw(PROSE))
        elif kind in ("call", "cut"):
            text = draw(st.sampled_from(fmt.render_variants(draw(call_lists))))
            pieces.append(text if kind == "call" else text[: draw(st.integers(0, len(text)))])
        elif kind == "marker":
            pieces.append(fmt.start_marker)
        else:
            pieces.append(draw(st.sampled_from(['{"name": 3}', "{", "[f(1)]", '{"a": 1}', "]"])))
    return "".join(pieces)


@pytest.mark.parametrize("name", ["llama3_json", "mistral", "pythonic"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_own_parser_agrees_with_vllm(name: str, data: st.DataObject) -> None:
    text = data.draw(outputs(name))
    assert own_calls(name, text) == vllm_calls(name, text), text
    assert get_format(name).parse(text).content == vllm_content(name, text), text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hermes_agrees_with_vllm_where_vllm_finds_calls(data: st.DataObject) -> None:
    """hermes keeps today's lenient parsing: where vLLM gives up on a text with a broken
    block, ooo-spec still returns the well-formed blocks; everywhere vLLM finds calls, the
    calls are the same."""
    text = data.draw(outputs("hermes"))
    theirs = vllm_calls("hermes", text)
    if theirs is not None:
        assert own_calls("hermes", text) == theirs, text


# ----- real outputs of the embedded model -----------------------------------------------------
OUTPUTS = Path(__file__).parent / "data" / "embedded_tool_format_outputs.json"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_own_parser_agrees_with_vllm_on_embedded_model_outputs(name: str) -> None:
    """Texts the embedded model wrote under each format's fallback prompt: answered freely
    (`free`: mostly prose) and after the opening of a call (`prefilled`: calls, and the
    model's slips). Captured with the embedded weights (float32; greedy and one seeded
    sample per prompt); tests/integration/test_tool_formats_engine.py does the same live
    through the vLLM engine."""
    data = json.loads(OUTPUTS.read_text(encoding="utf-8"))
    texts = data["free"][name] + data["prefilled"][name]
    found = 0
    for text in texts:
        theirs = vllm_calls(name, text)
        found += theirs is not None
        if name == "hermes" and theirs is None:
            continue  # hermes keeps well-formed blocks where vLLM gives up (see hermes.py)
        assert own_calls(name, text) == theirs, text
    # Not vacuous: the model's calls were parsed in this format. Except pythonic: vLLM reads a
    # pythonic output only when all of it is the call list, and the 135M model always goes on
    # talking after the `]`; both parsers agree those are content.
    assert found > 0 or name == "pythonic"


# ----- registry and config ------------------------------------------------------------------
def test_config_accepts_every_vllm_tool_parser_and_nothing_else() -> None:
    from pydantic import ValidationError

    from app.vllm_names import TOOL_PARSERS

    assert set(FORMATS) < set(TOOL_PARSERS)
    for name in TOOL_PARSERS:
        assert EngineConfig(tool_format=name).tool_format == name
        assert get_format(name).vllm_parser == name
    with pytest.raises(ValidationError, match="not a vLLM 0.32 tool parser"):
        EngineConfig(tool_format="qwen_xml")


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown tool format 'qwen_xml'.*hermes"):
        get_format("qwen_xml")


def test_hermes_prompt_is_todays_byte_for_byte() -> None:
    from app.formats import tool_format

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert get_format("hermes").system_prompt(tools) == tool_format.TOOL_PROMPT.format(
        tools='{"name": "f", "parameters": {"type": "object"}}')


def test_pythonic_renders_python_literals() -> None:
    text = get_format("pythonic").render(
        [ParsedCall("f", {"a": True, "b": None, "c": "it's", "d": {"k": [1.5, -2]}})])
    assert text == "[f(a=True, b=None, c=\"it's\", d={'k': [1.5, -2]})]"


def test_mistral_content_before_the_marker() -> None:
    parsed = get_format("mistral").parse('Checking.[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert parsed.content == "Checking."
    assert [c.name for c in parsed.calls] == ["f"]
    blank = ' \n[TOOL_CALLS] [{"name": "f", "arguments": {}}]'
    assert get_format("mistral").parse(blank).content is None
    assert vllm_content("mistral", blank) is None


# ----- streaming: what may be sent before a call --------------------------------------------
@pytest.mark.parametrize(("name", "text", "expected"), [
    ("hermes", "Let me check.", ("Let me check.", False)),
    ("hermes", "Let me check.<tool", ("Let me check.", False)),  # maybe a marker: held back
    ("hermes", "Let me check.<tool_call>\n{", ("Let me check.", True)),
    ("hermes", "a < b", ("a < b", False)),
    ("mistral", "Sure[TOOL_", ("Sure", False)),
    ("mistral", "Sure[TOOL_CALLS][{", ("Sure", True)),
    ("llama3_json", "<|python", ("", False)),
    ("llama3_json", '{"name', ("", True)),
    ("llama3_json", 'Use {"name": 1}', ('Use {"name": 1}', False)),
    ("pythonic", "[get_weather(", ("", True)),
    ("pythonic", "It is sunny.", ("It is sunny.", False)),
])
def test_stream_content(name: str, text: str, expected: tuple[str, bool]) -> None:
    assert get_format(name).stream_content(text) == expected


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_streamed_content_never_runs_ahead_of_the_final_parse(name: str) -> None:
    """Prose then a call, streamed a character at a time: the content sent is always a
    prefix of the final content, and the call is seen as started by the end."""
    fmt = get_format(name)
    call = fmt.render([ParsedCall("get_weather", {"city": "Paris"})])
    prose = "" if name in ("llama3_json", "pythonic") else "Checking now. "
    text = prose + call
    final = fmt.parse(text)
    assert [c.name for c in final.calls] == ["get_weather"]
    for end in range(len(text) + 1):
        sent, started = fmt.stream_content(text[:end])
        assert (final.content or "").startswith(sent.strip()) or sent.strip() == ""
    assert started
