"""Every tool format vLLM parses, read by vLLM's own parser and written through the family's
chat template (app/formats/tool_formats/vllm_format.py).

- Round trip: for every first-class family (app/formats/tool_formats/families.py), a golden
  set of calls rendered through the family's template and read back by vLLM's parser of that
  name gives the same calls.
- Streaming: an output fed token by token to ooo-spec's output stream gives the deltas vLLM's
  `Parser.parse_delta` gives on the same token sequence, and its pieces join to the finished
  parse.
- The names: config accepts exactly vLLM 0.32's (tests/unit/test_vllm_names.py is below).

The tokenizer is the embedded model's, with the family's markers added as single tokens (what
the family's own tokenizer has; vLLM's kimi_k2, deepseek_v31, mistral and harmony parsers look
them up by id).
"""

from __future__ import annotations

import copy
import logging
from functools import cache
from typing import Any

import pytest

from app.formats.output_stream import OutputStream
from app.formats.reasoning import Reasoning
from app.formats.tool_format import placeholder_call, schema_drafts
from app.formats.tool_formats import ParsedCall, VllmFormat, get_format
from app.formats.tool_formats.families import FAMILIES
from app.formats.tool_formats.vllm_parsing import (
    VllmParsing,
    keeps_special_tokens,
    parser_class,
    vllm_request,
)

GOLDEN: dict[str, list[ParsedCall]] = {
    "nested": [ParsedCall("search", {"filter": {"range": {"min": 1, "max": 2.5},
                                                "tags": ["a", "b"]}, "q": "x"})],
    "arrays": [ParsedCall("sum", {"ids": [1, 2, 3], "names": ["x", "y"]})],
    "numbers": [ParsedCall("calc", {"n": 42, "x": -3.5, "big": 12345678901, "flag": True})],
    "unicode": [ParsedCall("get_weather", {"city": "Zürich 東京 🚀",
                                           "note": 'line1\nline2 "quoted" \\ back'})],
    "empty": [ParsedCall("ping", {})],
    "several": [ParsedCall("get_weather", {"city": "Paris"}),
                ParsedCall("get_time", {"zone": "CET"}),
                ParsedCall("ping", {})],
}
# A string holding the format's own markers (its call opener and a closing tag).
MARKERS = "<tool_call> </parameter> </arg_value> [ARGS] <|call|> <|tool_call_end|>"
# Formats whose markers end a value wherever they stand (XML without escaping; Kimi's and
# harmony's marker tokens inside JSON): a value holding them ends early in vLLM's parser too,
# as the model's own template writes it the same way.
MARKER_LIMITS = {"glm45", "glm47", "qwen3_coder", "qwen3_xml", "minimax_m2", "kimi_k2",
                 "openai"}

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object"}


def tools_for(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    """One tool per called name, its parameters typed as the golden values (XML parsers type
    values by the schema)."""
    tools: dict[str, dict[str, Any]] = {}
    for call in calls:
        props = {k: {"type": _JSON_TYPES[type(v)]} for k, v in call.arguments.items()}
        tools[call.name] = {"type": "function", "function": {
            "name": call.name,
            "parameters": {"type": "object", "properties": props, "required": list(props)}}}
    return list(tools.values())


@cache
def base_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    logging.getLogger("vllm").setLevel(logging.CRITICAL)
    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


@cache
def family_tokenizer(name: str) -> Any:
    """The embedded tokenizer with the family's markers as single (non-special, so decoded
    outputs keep them) tokens."""
    from tokenizers import AddedToken

    tokenizer = copy.deepcopy(base_tokenizer())
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False)
                          for m in FAMILIES[name].markers])
    return tokenizer


@cache
def family_format(name: str) -> VllmFormat:
    fmt = get_format(name, family_tokenizer(name), FAMILIES[name].template_text())
    if not isinstance(fmt, VllmFormat):  # hermes: hand-written; its vLLM-backed twin here
        fmt = VllmFormat(name, family_tokenizer(name), FAMILIES[name].template_text())
    return fmt


def same_calls(got: list[ParsedCall], expected: list[ParsedCall]) -> bool:
    return [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in expected]


@pytest.mark.parametrize("case", sorted(GOLDEN))
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_rendered_calls_parse_back_with_vllm(name: str, case: str) -> None:
    fmt = family_format(name)
    calls = GOLDEN[case]
    if fmt.renderer is not None:  # the text is the model's turn, without its frame
        head, before, end = fmt.renderer.frame()
        text = fmt.render(calls)
        turn = fmt.renderer._apply([{"role": "user", "content": "ping"}, {
            "role": "assistant", "content": "", "tool_calls": [
                {"id": f"functions.{c.name}:{i}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(calls)]}], False)
        assert turn in (head + text + end, head + before + text + end)
        assert not end or not text.endswith(end)
    for text in fmt.render_variants(calls):
        parsed = fmt.parse(text, tools_for(calls))
        assert same_calls(parsed.calls, calls), (text, parsed)
        assert not (parsed.content or "").strip(), parsed.content
        assert fmt.call_start(text) == len(text) - len(text.lstrip())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_strings_holding_the_formats_markers(name: str) -> None:
    """The JSON formats round-trip a value holding every format's markers; the others cannot
    (`MARKER_LIMITS`), in vLLM as in the model's own template: where vLLM's parser splits the
    call at a marker inside the value, the text is content and no call (never a call whose
    arguments are not an object, which no client can read)."""
    fmt = family_format(name)
    calls = [ParsedCall("echo", {"text": MARKERS})]
    text = fmt.render(calls)
    parsed = fmt.parse(text, tools_for(calls))
    assert same_calls(parsed.calls, calls) == (name not in MARKER_LIMITS), parsed
    assert all(isinstance(c.arguments, dict) for c in parsed.calls), parsed
    if not parsed.calls and name != "openai":  # harmony's text is channels, never content
        assert parsed.content and "echo" in parsed.content, parsed


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_schema_drafts_are_the_formats_text(name: str) -> None:
    """The schema draft of a tool (its keys, the format's fixed text, placeholder values) is
    a call vLLM reads as a call of that tool."""
    tool = tools_for([ParsedCall("get_weather", {"city": "Paris", "days": 3})])[0]
    fmt = family_format(name)
    drafts = fmt.render_variants([placeholder_call(tool)])
    assert drafts
    for text in drafts:
        assert [c.name for c in fmt.parse(text, [tool]).calls] == ["get_weather"]


OPEN = {"type": "object", "required": ["city", "days", "metric", "unit"], "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "unit": {"type": "string", "enum": ["c", "f"]}}}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_schema_drafts_stop_where_each_open_value_begins(name: str) -> None:
    """A schema draft stops at each value the schema leaves open (three here; the enum's first
    value is drafted) and nowhere else: up to the first stop it is the text of any call of
    the tool, one character more and it is the placeholder's."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": OPEN}}
    fmt = family_format(name)
    drafts = schema_drafts(fmt.render_variants([placeholder_call(tool)]),
                           fmt.render_variants([placeholder_call(tool, alternate=True)]))
    real = fmt.render_variants([ParsedCall("get_weather", {
        "city": "Paris", "days": 3, "metric": True, "unit": "c"})])
    assert drafts and len(real) == len(drafts)
    for draft, text in zip(drafts, real, strict=True):
        assert len(draft.stops) == 3, draft
        first = draft.stops[0]
        assert text.startswith(draft.text[:first]), (draft, text)
        assert not text.startswith(draft.text[:first + 1]), (draft, text)


def token_pieces(name: str, text: str) -> list[tuple[str, list[int]]]:
    """`text` as a model streams it: one token at a time, each with the text it adds (gpt-oss
    in harmony's own tokens, as vLLM reads it)."""
    if name == "openai":
        from app.formats.tool_formats.vllm_parsing import _harmony_encoding

        encoding = _harmony_encoding()
        ids = encoding.encode(text, allowed_special="all")
        decode = encoding.decode_utf8
    else:
        tokenizer = family_tokenizer(name)
        ids = tokenizer.encode(text, add_special_tokens=False)
        decode = tokenizer.decode
    pieces, sent = [], ""
    for i in range(len(ids)):
        try:
            so_far = decode(ids[: i + 1])
        except Exception:  # half a character (harmony's decoder refuses it)
            so_far = sent + "\ufffd"
        if so_far.endswith("\ufffd"):  # half a character: it goes out with the next token
            pieces.append(("", [ids[i]]))
            continue
        pieces.append((so_far[len(sent):], [ids[i]]))
        sent = so_far
    return pieces


def vllm_deltas(name: str, reasoning: str | None, pieces: list[tuple[str, list[int]]],
                tools: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[Any, ...]]]]:
    """What `vllm serve`'s parser sends for each piece, called as its serving layer calls it."""
    from app.formats.tool_formats.vllm_parsing import to_piece

    request = vllm_request(tools)
    parser = parser_class(name, reasoning)(family_tokenizer(name), request.tools)
    out = []
    for i, (text, ids) in enumerate(pieces):
        delta = parser.parse_delta(text, ids, request, prompt_token_ids=[],
                                   finished=i == len(pieces) - 1)
        read = to_piece(delta)
        out.append((read.reasoning, read.content,
                    [(c.index, c.name, c.arguments) for c in read.calls]))
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_streamed_deltas_are_vllms(name: str) -> None:
    fmt = family_format(name)
    calls = GOLDEN["several"] + GOLDEN["nested"]
    tools = tools_for(calls)
    text = fmt.render(calls)
    pieces = token_pieces(name, text)
    stream = OutputStream("auto", fmt, None, tools)
    ours = []
    for piece, ids in pieces:
        delta = stream.feed(piece, ids)
        ours.append((delta.reasoning, delta.content,
                     [(c.index, c.name, c.arguments) for c in delta.calls]))
    # The last piece: vLLM flushes what its parser holds (ooo-spec's stream sends it from the
    # finished parse); compare every piece before it.
    assert ours[:-1] == vllm_deltas(name, None, pieces, tools)[:-1]
    # The streamed calls join to the finished parse's.
    joined: dict[int, list[str]] = {}
    for _, _, deltas in vllm_deltas(name, None, pieces, tools):
        for index, call_name, arguments in deltas:
            joined.setdefault(index, ["", ""])
            joined[index][0] += call_name or ""
            joined[index][1] += arguments
    import json

    assert [(n, json.loads(a)) for n, a in joined.values()] == [
        (c.name, c.arguments) for c in calls]


def test_streamed_reasoning_is_vllms() -> None:
    """qwen3_coder with the qwen3 reasoning parser: the thoughts stream as reasoning, then
    the call, exactly as vLLM streams them."""
    name = "qwen3_coder"
    fmt = family_format(name)
    calls = GOLDEN["several"]
    tools = tools_for(calls)
    text = "<think>I should look both up.</think>\n\n" + fmt.render(calls)
    pieces = token_pieces(name, text)
    stream = OutputStream("auto", fmt, Reasoning("qwen3"), tools)
    ours = []
    for piece, ids in pieces:
        delta = stream.feed(piece, ids)
        ours.append((delta.reasoning, delta.content,
                     [(c.index, c.name, c.arguments) for c in delta.calls]))
    theirs = vllm_deltas(name, "qwen3", pieces, tools)
    assert ours[:-1] == theirs[:-1]
    assert "".join(r for r, _, _ in ours) == "I should look both up."


def test_every_vllm_tool_parser_reads_through_vllm() -> None:
    """Every vLLM 0.32 name is a format read by vLLM's parser of that name: built with a
    tokenizer that has the markers it looks up (or refused by vLLM, with vLLM's reason)."""
    from app.vllm_names import TOOL_PARSERS

    built = 0
    for name in TOOL_PARSERS:
        fmt = get_format(name, base_tokenizer())
        if not fmt.vllm_backed:
            continue
        try:
            out = fmt.parse("Hello there.", [])
        except (RuntimeError, ValueError, ImportError, TypeError):
            continue  # the tokenizer lacks the parser's tokens (vLLM's own refusal)
        built += 1
        assert not out.calls
    assert built >= 30


def test_a_template_in_another_dialect_is_told_apart() -> None:
    """The startup check (chat_prompt.format_mismatch) asks the format whether a template's
    past call is one of its calls: vLLM's parser of the name decides."""
    calls = GOLDEN["several"]
    tools = [{"type": "function", "function": {"name": call.name, "parameters": {
        "type": "object", "properties": {key: {"type": "string"} for key in call.arguments}}}}
        for call in calls]
    qwen, glm = family_format("qwen3_coder"), family_format("glm47")
    assert qwen.writes_call(qwen.render(calls) + "<|im_end|>\n", tools)
    assert not qwen.writes_call(glm.render(calls), tools)
    assert not glm.writes_call(family_format("kimi_k2").render(calls), tools)


def test_deepseek_v31_without_thinking_is_read_as_vllm_serve_reads_it() -> None:
    """DeepSeek-V3.1's reasoning parser (deepseek_v3) thinks only when the request switches it
    on: a plain request's call is content and a call, as `vllm serve` returns it (a switch
    rebuilt as `enable_thinking: true` made all of it reasoning, and the call was lost), and
    its drafts start at the first token."""
    name = "deepseek_v31"
    fmt = family_format(name)
    calls = GOLDEN["several"]
    tools = tools_for(calls)
    text = fmt.render(calls)
    reasoning = Reasoning.for_request("deepseek_v3", None, fmt.tokenizer)
    assert reasoning is not None and not reasoning.thinking
    assert reasoning.ended_at(text[:3]) == 0
    thoughts, parsed = VllmParsing(name, "deepseek_v3", fmt.tokenizer).parse(
        text, tools, reasoning.vllm_kwargs)
    assert thoughts is None and same_calls(parsed.calls, calls)
    stream = OutputStream("auto", fmt, reasoning, tools)
    streamed = [c for piece, ids in token_pieces(name, text)
                for c in stream.feed(piece, ids).calls]
    assert sorted({c.name for c in streamed if c.name}) == sorted({c.name for c in calls})


def test_the_thinking_switch_is_the_one_vllms_parser_reads() -> None:
    """Who thinks, and between which markers, is what vLLM's parser of the name says for the
    request's own `chat_template_kwargs`; gpt-oss's reasoning boundary is passed from the
    first token (its channels are harmony's to read), so a call is drafted where it starts."""
    from app.drafting.auto_drafts import phase

    tok = base_tokenizer()
    kimi = Reasoning.for_request("kimi_k2", None, tok)
    assert kimi is not None and kimi.thinking and kimi.ended_at("hmm</think>Hi") == 11
    quiet = Reasoning.for_request("kimi_k2", {"enable_thinking": False}, tok)
    assert quiet is not None and not quiet.thinking and quiet.ended_at("") == 0
    assert quiet.vllm_kwargs == {"enable_thinking": False}  # passed on as sent
    gemma = Reasoning.for_request("gemma4", {"enable_thinking": True}, tok)
    assert gemma is not None and gemma.thinking and (gemma.start, gemma.end) != (
        "<think>", "</think>")  # gemma4's own channel markers, read from vLLM
    assert gemma.ended_at(f"{gemma.start}thought{gemma.end}Hi") == len(
        f"{gemma.start}thought{gemma.end}")
    harmony = family_format("openai")
    call = harmony.render(GOLDEN["several"][:1])
    gptoss = Reasoning.for_request("openai_gptoss", None, harmony.tokenizer)
    assert gptoss is not None and not gptoss.thinking
    text = "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant" + call
    assert phase(text, harmony, gptoss, [call]).kind == "call"
    # Without the model's tokenizer (a hand-written format on the router): as before.
    assert Reasoning.for_request("kimi_k2", {"enable_thinking": False}, None) == Reasoning(
        "kimi_k2", template_kwargs={"enable_thinking": False})


def test_special_tokens_are_kept_where_vllms_parser_asks() -> None:
    """Kimi's markers are special tokens in its tokenizer: vLLM's kimi_k2 parser has the
    output decoded with them (`adjust_request`) when tools are offered, else a call's markers
    are gone before it is parsed. The main model asks its engine for the same; DeepSeek V3.1's
    parser does not ask, harmony is always read with its markers, and a parser vLLM will not
    build with the tokenizer (a hand-written format's) keeps vLLM's default."""
    from types import SimpleNamespace

    from app.config import AppConfig
    from app.main_model.service import MainModelService
    from app.openai_models import ChatCompletionRequest

    kimi = family_tokenizer("kimi_k2")
    assert keeps_special_tokens("kimi_k2", None, kimi, True, "auto")
    assert keeps_special_tokens("kimi_k2", None, kimi, True, "required")
    assert not keeps_special_tokens("kimi_k2", None, kimi, False, "auto")
    assert not keeps_special_tokens("deepseek_v31", None, family_tokenizer("deepseek_v31"), True)
    assert keeps_special_tokens("openai", None, base_tokenizer(), False)
    assert not keeps_special_tokens("llama3_json", None, base_tokenizer(), True)

    def asks(tool_format: str, tools: bool) -> bool:
        config = AppConfig.model_validate({"main": {"engine": {"tool_format": tool_format}}})
        service = MainModelService(config, engine=SimpleNamespace(tokenizer=kimi))  # type: ignore[arg-type]
        request = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "Hi"}]})
        return service.keeps_special_tokens(request, "auto", tools)

    assert asks("kimi_k2", True) and not asks("kimi_k2", False)
    assert not asks("hermes", True)  # the hand-written hermes reads no special tokens
