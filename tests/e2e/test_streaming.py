"""End to end: streaming like vLLM with the real app, the embedded model and the real `openai`
SDK. Text streams as it is decoded even with tools offered; a call streams its id and name
first and its arguments in pieces, which join to the non-streamed call; `ooo_spec` rides on
the last chunk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_openai_client import MESSAGES, WEATHER

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
# A past turn that says what it does before calling (rendered in the hermes format as text,
# then `<tool_call>`).
TEXT_THEN_CALL = [
    {"role": "user", "content": "What is the weather in Rome, in celsius?"},
    {"role": "assistant", "content": "I will look up the weather in Rome.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {
         "name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    {"role": "assistant", "content": "It is 18 degrees and sunny in Rome."},
    {"role": "user", "content": "What is the weather in Paris, in celsius?"},
]


# Plain decoding, one token per step, so "in pieces" is certain: with speculation a hit can
# accept a whole call in one step (one delta). The forced test runs both ways.
PLAIN = {"ooo_spec": {"enabled": False}}


def create(client: Any, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, temperature=0, **kw)


def accumulate(chunks: list[Any]) -> dict[str, Any]:
    """The message the chunks build, and how it arrived."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    order: list[str] = []  # 'content' / 'call' per chunk, in order
    for c in chunks:
        if not c.choices:
            continue
        delta = c.choices[0].delta
        if delta.content:
            content.append(delta.content)
            order.append("content")
        for call in delta.tool_calls or []:
            order.append("call")
            if call.index not in calls:
                # A call's first delta: its id, type and name.
                assert call.id and call.type == "function" and call.function.name
                calls[call.index] = {"id": call.id, "name": call.function.name,
                                     "arguments": []}
            else:
                assert call.id is None or call.id == calls[call.index]["id"]
            if call.function and call.function.arguments:
                calls[call.index]["arguments"].append(call.function.arguments)
    return {"content": content, "calls": calls, "order": order}


def test_text_streams_in_pieces_with_tools_offered(openai_client: Any) -> None:
    ask = {"messages": [{"role": "user", "content": "Say hello to Paris in one sentence."}],
           "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 24, "extra_body": PLAIN}
    whole = create(openai_client, **ask)
    assert not whole.choices[0].message.tool_calls
    chunks = list(create(openai_client, stream=True, **ask))
    got = accumulate(chunks)
    assert len(got["content"]) > 1  # as decoded, not once at the end
    assert "".join(got["content"]) == whole.choices[0].message.content
    assert not got["calls"]
    assert "ooo_spec" in chunks[-1].model_extra


def test_text_near_a_call_marker_streams_and_joins(openai_client: Any) -> None:
    """After a past turn that said what it did and called a tool, the greedy model (which
    never opens a `<tool_call>` freely: tests/unit/data/embedded_tool_format_outputs.json)
    copies the text and writes `<tool_response>` markup: `<tool_` is held while it may open a
    call, then goes out as text. Text then a call is covered without a model in
    tests/unit/test_streaming.py."""
    ask = {"messages": TEXT_THEN_CALL, "tools": [WEATHER], "tool_choice": "auto",
           "max_tokens": 64, "extra_body": PLAIN}
    whole = create(openai_client, **ask)
    chunks = list(create(openai_client, stream=True, stream_options={"include_usage": True},
                         **ask))
    got = accumulate(chunks)
    message = whole.choices[0].message
    assert len(got["content"]) > 1
    assert "".join(got["content"]) == message.content
    assert "<tool_response>" in (message.content or "")
    assert not got["calls"] and not message.tool_calls
    assert chunks[-1].usage is not None and "ooo_spec" in chunks[-1].model_extra


def check_calls(got: dict[str, Any], tool_calls: Any, pieces: bool = True) -> None:
    """The streamed calls are the non-streamed ones; each call's arguments came in pieces."""
    assert [c["name"] for c in got["calls"].values()] == [t.function.name for t in tool_calls]
    for call, whole in zip(got["calls"].values(), tool_calls, strict=True):
        assert len(call["arguments"]) > 1 or not pieces
        joined = "".join(call["arguments"])
        assert joined == whole.function.arguments
        assert json.loads(joined) == json.loads(whole.function.arguments)


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("speculate", [False, True])
def test_forced_call_streams_its_arguments_in_pieces(
    openai_client: Any, choice: Any, speculate: bool
) -> None:
    ask = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": choice, "max_tokens": 64,
           "extra_body": {"ooo_spec": {"enabled": speculate}}}
    whole = create(openai_client, **ask)
    chunks = list(create(openai_client, stream=True, **ask))
    got = accumulate(chunks)
    check_calls(got, whole.choices[0].message.tool_calls, pieces=not speculate)
    assert not got["content"]
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    report = last.model_extra["ooo_spec"]
    assert report["main"]["completion_tokens"] == whole.usage.completion_tokens
