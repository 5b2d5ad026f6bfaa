"""Tool calls read as the output streams (app/formats/tool_formats/incremental.py,
app/formats/output_stream.py): outputs fed in pieces cut anywhere (inside markers, keys,
escapes, numbers) give deltas that join to the finished parse, name first, and never send
text the finished parse does not have."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.formats.output_stream import OutputStream
from app.formats.reasoning import Reasoning
from app.formats.tool_format import parse_forced, render_forced_variants
from app.formats.tool_formats import FORMATS, ParsedCall, get_format
from app.formats.tool_formats.incremental import CallList, CallStream, JsonValue
from tests.unit.test_tool_formats import (
    SPECIAL_TOKEN,
    _special_tokenizer,
    call_lists,
    tokenizer,
    values,
    vllm_parser,
    vllm_request,
)

OUTPUTS = Path(__file__).parent / "data" / "embedded_tool_format_outputs.json"


def pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def joined(stream: CallStream, parts: list[str]) -> list[tuple[str, str]]:
    """(name, arguments) per call from the deltas; checks the name comes first, once."""
    calls: dict[int, list[Any]] = {}
    for part in parts:
        for delta in stream.feed(part):
            if delta.name is not None:
                assert delta.index == len(calls), "calls are numbered in order"
                calls[delta.index] = [delta.name, ""]
            else:
                assert delta.index in calls, "arguments before the name"
            calls[delta.index][1] += delta.arguments
    return [(name, args) for name, args in calls.values()]


def canonical(calls: list[ParsedCall]) -> list[tuple[str, str]]:
    """What the non-streamed response carries (chat_service: `json.dumps(arguments)`)."""
    return [(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in calls]


def _clean(invocation: list[ParsedCall]) -> None:
    blob = json.dumps([c.arguments for c in invocation], ensure_ascii=False)
    assume("</tool_call>" not in blob and "[TOOL_CALLS]" not in blob)


# ----- every format, every whitespace style, cut anywhere ---------------------------------
@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invocation=call_lists, cuts=st.lists(st.integers(0, 10**6), max_size=40),
       prose=st.sampled_from(["", "Let me check.\n", "Sure, one moment: "]))
def test_streamed_calls_join_to_the_finished_parse(
    name: str, invocation: list[ParsedCall], cuts: list[int], prose: str
) -> None:
    _clean(invocation)
    fmt = get_format(name)
    if name in ("llama3_json", "pythonic"):
        prose = ""  # vLLM reads these calls only at the start of the output
    for call_text in fmt.render_variants(invocation):
        text = prose + call_text
        final = fmt.parse(text)
        assert final.calls, text
        start = fmt.call_start(text)
        assert joined(fmt.call_stream(), pieces(text[start:], cuts)) == canonical(final.calls)
        # A character at a time: every marker, key and escape cut in every place.
        assert joined(fmt.call_stream(), list(text[start:])) == canonical(final.calls)


@pytest.mark.parametrize("named", [False, True])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invocation=call_lists, cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_forced_calls_join_to_the_finished_parse(
    named: bool, invocation: list[ParsedCall], cuts: list[int]
) -> None:
    if named:
        invocation = invocation[:1]
    tools = [{"type": "function", "function": {"name": c.name, "parameters": {}}}
             for c in invocation]
    for text in render_forced_variants(invocation, tools, invocation[0].name if named else None):
        final = parse_forced(text, invocation[0].name if named else None)
        assert joined(CallList(single=named), pieces(text, cuts)) == canonical(final.calls)
        assert joined(CallList(single=named), list(text)) == canonical(final.calls)


@settings(max_examples=200, deadline=None)
@given(value=values, cuts=st.lists(st.integers(0, 10**6), max_size=20),
       style=st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")},
                              {"ensure_ascii": True}]))
def test_json_value_is_written_canonically_as_it_comes(
    value: Any, cuts: list[int], style: dict[str, Any]
) -> None:
    text = json.dumps(value, **{"ensure_ascii": False, **style})
    reader = JsonValue()
    out = ""
    for part in pieces(text, cuts):
        reader.feed(part)
        piece = "".join(reader.out)
        reader.out.clear()
        out += piece
        # Never ahead of the canonical text: what is sent is never taken back.
        assert json.dumps(value, ensure_ascii=False).startswith(out)
    reader.finish()
    out += "".join(reader.out)
    assert reader.done and out == json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("text", ['{"a": 1,}', '{"a" 1}', "[1 2]", '{"a": tru}', '"\x01"',
                                  "NaN", '{"a": "\\x"}', "01"])
def test_json_value_stops_at_what_is_not_json(text: str) -> None:
    reader = JsonValue()
    reader.feed(text)
    reader.finish()
    assert not reader.done


def test_arguments_stream_in_pieces_before_the_call_ends() -> None:
    stream = get_format("hermes").call_stream()
    first = stream.feed('<tool_call>\n{"name": "get_weather", "argu')
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "get_weather", "")]
    middle = stream.feed('ments": {"city":"Par')
    assert [(d.name, d.arguments) for d in middle] == [(None, '{"city": "Par')]
    assert [d.arguments for d in stream.feed('is", "n": 1')] == ['is", "n": ']  # 1 may go on
    assert [d.arguments for d in stream.feed("2}}\n</tool_call>")] == ["12}"]


def test_name_after_the_arguments_waits_for_the_name() -> None:
    stream = get_format("hermes").call_stream()
    assert stream.feed('<tool_call>{"arguments": {"a": 1}, ') == []
    [delta] = stream.feed('"name": "f"}</tool_call>')
    assert (delta.index, delta.name, delta.arguments) == (0, "f", '{"a": 1}')


def test_arguments_that_are_not_an_object_are_left_to_the_finished_parse() -> None:
    stream = get_format("hermes").call_stream()
    deltas = stream.feed('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert [(d.name, d.arguments) for d in deltas] == [("f", "")]


def test_pythonic_sends_a_call_when_its_parenthesis_closes() -> None:
    stream = get_format("pythonic").call_stream()
    assert [(d.name, d.arguments) for d in stream.feed("[get_weather(city='Pa")] == [
        ("get_weather", "")]
    assert stream.feed("ris (FR)'") == []  # the `)` inside the string does not close it
    assert [(d.index, d.name, d.arguments) for d in stream.feed("), add(")] == [
        (0, None, '{"city": "Paris (FR)"}'), (1, "add", "")]
    assert [(d.index, d.arguments) for d in stream.feed("a=1)]")] == [(1, '{"a": 1}')]


# ----- the embedded model's own outputs ------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("size", [1, 3, 8])
def test_embedded_model_outputs_stream_as_they_parse(name: str, size: int) -> None:
    """What SmolLM2 wrote under each format (tests/unit/test_tool_formats.py): prose and
    calls, and its slips (calls that run on into prose, broken JSON). Where the finished
    parse has calls the stream gives the same ones; the content sent is never ahead of the
    finished content."""
    data = json.loads(OUTPUTS.read_text(encoding="utf-8"))
    fmt = get_format(name)
    with_calls = 0
    for text in data["free"][name] + data["prefilled"][name]:
        final = fmt.parse(text)
        got = stream_output(OutputStream("auto", fmt, None), text, size)
        assert (final.content or "").startswith(got["content"]) or got["content"].strip() == (
            final.content or "").strip(), text
        if final.calls:
            with_calls += 1
            assert got["calls"] == canonical(final.calls), text
    assert with_calls > 0 or name == "pythonic"  # see test_tool_formats: never a whole list


def stream_output(stream: OutputStream, text: str, size: int) -> dict[str, Any]:
    got: dict[str, Any] = {"reasoning": "", "content": "", "calls": []}
    for i in range(0, len(text), size):
        delta = stream.feed(text[i:i + size])
        got["reasoning"] += delta.reasoning
        got["content"] += delta.content
        for call in delta.calls:
            if call.name is not None:
                got["calls"].append((call.name, ""))
            name, args = got["calls"][call.index]
            got["calls"][call.index] = (name, args + call.arguments)
    return got


# ----- content before a call, reasoning before content ---------------------------------------
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_text_then_a_call(size: int) -> None:
    text = "Let me check the weather.\n" + HERMES_CALL
    got = stream_output(OutputStream("auto", get_format("hermes"), None), text, size)
    final = get_format("hermes").parse(text)
    # Whitespace before the call is held back: the content is the finished content exactly.
    assert got["content"] == final.content == "Let me check the weather."
    assert got["calls"] == canonical(final.calls)


def test_content_streams_before_the_call_and_holds_only_a_possible_marker() -> None:
    stream = OutputStream("auto", get_format("hermes"), None)
    assert stream.feed("Let me").content == "Let me"
    assert stream.feed(" check <tool").content == " check"  # ' <tool' may open a call
    assert stream.feed("s> are fine").content == " <tools> are fine"
    assert stream.feed(" ").content == ""  # trailing whitespace waits
    delta = stream.feed("<tool_call>{")
    assert delta.content == "" and delta.calls == []


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("size", [1, 3, 100])
def test_reasoning_then_content(parser: str, size: int) -> None:
    reasoning = Reasoning(parser)  # type: ignore[arg-type]
    text = "<think>\nThe user wants Paris. a<b\n</think>\n\nIt is sunny."
    got = stream_output(OutputStream("auto", get_format("hermes"), reasoning), text, size)
    thoughts, content = reasoning.split(text)
    assert got["reasoning"] == thoughts and got["content"] == content
    assert "<" not in got["reasoning"].replace("a<b", "")  # no marker leaked


@pytest.mark.parametrize("size", [1, 4])
def test_qwen3_calls_without_closing_its_thoughts(size: int) -> None:
    reasoning = Reasoning("qwen3")
    text = "I should call the tool.\n" + HERMES_CALL
    got = stream_output(OutputStream("auto", get_format("hermes"), reasoning), text, size)
    thoughts, content = reasoning.split(text)
    assert got["reasoning"] == thoughts
    assert got["calls"] == canonical(get_format("hermes").parse(content or "").calls)


def test_no_thinking_is_all_content() -> None:
    reasoning = Reasoning("qwen3", thinking=False)
    got = stream_output(OutputStream("none", get_format("hermes"), reasoning), "Hi <think>", 2)
    assert got == {"reasoning": "", "content": "Hi <think>", "calls": []}


def test_forced_output_is_all_calls() -> None:
    text = '[\n  {\n    "name": "f",\n    "arguments": {\n      "x": 1\n    }\n  }\n]'
    got = stream_output(OutputStream("required", get_format("hermes"), None), text, 3)
    assert got == {"reasoning": "", "content": "", "calls": [("f", '{"x": 1}')]}


# ----- against vLLM's own streaming parsers ----------------------------------------------------
def vllm_streamed(name: str, text: str) -> tuple[str, list[tuple[str, Any]]]:
    """vLLM's `extract_tool_calls_streaming` fed `text` a token at a time, as its server
    feeds it: (content, [(name, arguments as JSON)])."""
    tok = _special_tokenizer(name) if name in SPECIAL_TOKEN else tokenizer()
    parser = vllm_parser(name)(tok)
    ids = tok.encode(text, add_special_tokens=False)
    previous, fed = "", 0
    content = ""
    calls: dict[int, list[Any]] = {}
    for i in range(len(ids)):
        current = tok.decode(ids[:i + 1])
        if current.endswith("\ufffd") and i < len(ids) - 1:
            continue  # half a character: vLLM's detokenizer waits for the rest too
        delta = parser.extract_tool_calls_streaming(
            previous, current, current[len(previous):], ids[:fed], ids[:i + 1],
            ids[fed:i + 1], vllm_request())
        previous, fed = current, i + 1
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls:
            held = calls.setdefault(call.index, [None, ""])
            function = call.function if isinstance(call.function, dict) else (
                call.function.model_dump() if call.function is not None else {})
            held[0] = function.get("name") or held[0]
            held[1] += function.get("arguments") or ""
    # Characters the tokenizer splits oddly (mid-character tokens) are out of scope here.
    assume(previous == text)
    # vLLM's llama3_json stream sends no arguments at all for `{}` (its non-streamed call
    # has `{}`, as ours has in both): read as `{}`.
    return content, [(n, json.loads(a or "{}")) for n, a in calls.values()]


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invocation=call_lists, prose=st.sampled_from(["", "Let me check.\n"]))
def test_streams_agree_with_vllms_streaming_parser(
    name: str, invocation: list[ParsedCall], prose: str
) -> None:
    """The same calls, read as they stream, as vLLM's parser of the same name reads them
    (vLLM streams the model's own argument text, here the canonical text: equal as JSON)."""
    _clean(invocation)
    fmt = get_format(name)
    if name in ("llama3_json", "pythonic"):
        prose = ""
    if name == "pythonic":
        # vLLM's pythonic stream sends a float's digits as partial JSON and breaks them
        # (`1.1e+16` arrives as invalid JSON, `1e-09` as 1.009; its non-streamed parse, like
        # ours, is right).
        assume(not re.search(r"\d[.eE]", fmt.render(invocation)))
    text = prose + fmt.render(invocation)
    their_content, theirs = vllm_streamed(name, text)
    ours = stream_output(OutputStream("auto", fmt, None), text, 1)
    # vLLM's llama3_json stream re-reads floats through partial JSON and may move their last
    # digit (2.4134060510903428e-73 arrives as ...438e-73); its non-streamed parse, like
    # ours, is exact. So floats are compared to 12 significant digits here.
    assert ([(n, _rounded(json.loads(a))) for n, a in ours["calls"]]
            == [(n, _rounded(a)) for n, a in theirs]), text
    assert ours["content"] == their_content.strip()  # hermes strips it (see hermes.py)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value

