"""Chat completion SSE (app/api/streaming.py) without a model: the main model's text pieces
and its finished completion in, OpenAI chunks out, shaped like vLLM's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.streaming import stream_sse
from app.formats.reasoning import Reasoning
from app.formats.tool_format import new_call_id, parse_forced
from app.formats.tool_formats import get_format
from app.openai_models import ChatCompletionRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        "</tool_call>")


def request(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, **extra})


def completion(req: ChatCompletionRequest, text: str, fmt: str = "hermes",
               reasoning_parser: str | None = None) -> dict[str, Any]:
    """The non-streamed completion of `text`, as the main model and ChatService make it."""
    mode = req.effective_tool_choice
    reasoning, answer = (Reasoning(reasoning_parser).split(text)  # type: ignore[arg-type]
                         if reasoning_parser else (None, text))
    if mode in ("required", "named"):
        parsed = parse_forced(answer or "", req.named_tool)
    elif mode == "auto":
        parsed = get_format(fmt).parse(answer or "")
    else:
        parsed = get_format(fmt).parse("")
        parsed.content = answer
    calls = [{"id": new_call_id(), "type": "function", "function": {
        "name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for c in parsed.calls]
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if reasoning is not None:
        message["reasoning"] = message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if calls else "stop",
                     "logprobs": {"content": [{"token": t} for t in text]}
                     if req.logprobs else None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": len(text),
                  "total_tokens": 10 + len(text), "prompt_tokens_details": {"cached_tokens": 0}},
        "ooo_spec": {"outcome": "miss", "tool_results": [
            {"tool_call_id": c["id"], "name": c["function"]["name"]} for c in calls]},
    }


async def events(req: ChatCompletionRequest, text: str, size: int = 1, **kw: Any
                 ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """One delta per `size` characters (a token, or a speculative step of several)."""
    for i in range(0, len(text), size):
        piece = text[i:i + size]
        yield "delta", {"text": piece, "logprobs": [{"token": t} for t in piece]}
    yield "final", completion(req, text, **kw)


async def collect(stream: AsyncIterator[str]) -> list[Any]:
    out = []
    async for line in stream:
        body = line.removeprefix("data: ").strip()
        out.append(body if body == "[DONE]" else json.loads(body))
    return out


def deltas(chunks: list[Any], index: int = 0) -> list[dict[str, Any]]:
    return [c["choices"][0]["delta"] for c in chunks[:-1]
            if c.get("choices") and c["choices"][0]["index"] == index]


def joined(chunks: list[Any], index: int = 0) -> dict[str, Any]:
    """The message a client builds from the deltas (as the openai SDK accumulates them)."""
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    for delta in deltas(chunks, index):
        message["content"] += delta.get("content") or ""
        message["reasoning"] += delta.get("reasoning") or ""
        assert delta.get("reasoning") == delta.get("reasoning_content")
        for call in delta.get("tool_calls") or []:
            held = message["tool_calls"].setdefault(call["index"], {
                "id": None, "name": None, "arguments": ""})
            if "id" in call:
                assert held["id"] is None, "one id per call"
                held["id"], held["name"] = call["id"], call["function"]["name"]
                assert call["type"] == "function"
            assert held["id"] is not None, "a call's first delta carries its id and name"
            held["arguments"] += call["function"].get("arguments") or ""
    return message


def final_message(chunks: list[Any], req: ChatCompletionRequest, text: str,
                  **kw: Any) -> dict[str, Any]:
    return completion(req, text, **kw)["choices"][0]["message"]


async def test_text_streams_then_the_call_in_pieces() -> None:
    req = request(tools=[WEATHER], tool_choice="auto")
    text = "Let me check the weather for you.\n" + CALL
    chunks = await collect(stream_sse(req, events(req, text), "m", get_format("hermes")))
    steps = deltas(chunks)
    content_chunks = [d for d in steps if d.get("content")]
    call_chunks = [d for d in steps if d.get("tool_calls")]
    assert len(content_chunks) > 1 and len(call_chunks) > 2
    # Text first, then the call: no content after the call started.
    first_call = steps.index(call_chunks[0])
    assert not any(d.get("content") for d in steps[first_call:])
    assert call_chunks[0]["tool_calls"][0]["function"]["name"] == "get_weather"
    got = joined(chunks)
    want = final_message(chunks, req, text)
    assert got["content"] == want["content"] == "Let me check the weather for you."
    [call] = got["tool_calls"].values()
    assert call["arguments"] == want["tool_calls"][0]["function"]["arguments"]
    assert json.loads(call["arguments"]) == {"city": "Paris", "days": 3}
    finish = [c for c in chunks[:-1] if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["tool_calls"]
    assert chunks[-1] == "[DONE]" and "ooo_spec" in chunks[-2]
    # Pre-executed results name the call by the id the stream gave it.
    assert chunks[-2]["ooo_spec"]["tool_results"][0]["tool_call_id"] == call["id"]


@pytest.mark.parametrize("fmt, text", [
    ("hermes", "Sure.\n" + CALL + "\n" + CALL),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "f", "parameters": {}}'),
    ("mistral", 'Ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}]'),
    ("pythonic", "[get_weather(city='Paris'), f(x=[1, 2])]"),
    ("hermes", "No call here, only <tool"),  # a held-back marker prefix comes out at the end
    ("llama3_json", '{"answer": 42}'),  # looks like a call, is content: sent at the end
])
@pytest.mark.parametrize("size", [1, 4])
async def test_every_format_joins_to_the_non_streamed_message(
    fmt: str, text: str, size: int
) -> None:
    req = request(tools=[WEATHER], tool_choice="auto")
    chunks = await collect(stream_sse(req, events(req, text, size, fmt=fmt), "m",
                                      get_format(fmt)))
    got, want = joined(chunks), final_message(chunks, req, text, fmt=fmt)
    assert got["content"] == (want["content"] or "")
    assert [(c["name"], c["arguments"]) for c in got["tool_calls"].values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls", [])]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
async def test_forced_calls_stream_their_arguments(choice: Any) -> None:
    req = request(tools=[WEATHER], tool_choice=choice)
    body = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}'
    text = f"[\n{body}\n]" if choice == "required" else body
    chunks = await collect(stream_sse(req, events(req, text, 2), "m"))
    args = [d["tool_calls"][0]["function"].get("arguments") for d in deltas(chunks)
            if d.get("tool_calls")]
    assert len([a for a in args if a]) > 1  # in pieces, before the end
    [call] = joined(chunks)["tool_calls"].values()
    assert call["name"] == "get_weather" and call["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
async def test_reasoning_streams_as_reasoning(parser: str) -> None:
    req = request(tools=[WEATHER], tool_choice="auto")
    text = "<think>\nParis, so call the tool.\n</think>\n\n" + CALL
    chunks = await collect(stream_sse(req, events(req, text, 3, reasoning_parser=parser), "m",
                                      get_format("hermes"), parser))  # type: ignore[arg-type]
    got = joined(chunks)
    want = final_message(chunks, req, text, reasoning_parser=parser)
    assert got["reasoning"] == want["reasoning"] == "\nParis, so call the tool.\n"
    assert len([d for d in deltas(chunks) if d.get("reasoning")]) > 1
    assert [c["arguments"] for c in got["tool_calls"].values()] == [
        c["function"]["arguments"] for c in want["tool_calls"]]
    assert "<think>" not in got["content"] and "</think>" not in got["content"]


async def test_logprobs_ride_on_the_step_that_decoded_them() -> None:
    req = request(tools=[WEATHER], tool_choice="auto", logprobs=True)
    text = "Hm.\n" + CALL
    chunks = await collect(stream_sse(req, events(req, text, 5), "m"))
    tokens = [t["token"] for c in chunks[:-1] if c.get("choices") and c["choices"][0]["logprobs"]
              for t in c["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == text  # every token once, the call's too (as vLLM)


async def test_execute_tools_holds_the_text_until_the_end() -> None:
    req = request(tools=[WEATHER], tool_choice="auto", ooo_spec={"execute_tools": True})
    text = "Checking.\n" + CALL
    chunks = await collect(stream_sse(req, events(req, text), "m"))
    steps = deltas(chunks)
    # The role chunk, one content chunk, one chunk with the whole call, the finish.
    assert steps[1] == {"content": "Checking."}
    [call] = steps[2]["tool_calls"]
    want = final_message(chunks, req, text)["tool_calls"][0]
    assert call["function"] == want["function"] and call["id"] == chunks[-2]["ooo_spec"][
        "tool_results"][0]["tool_call_id"]


async def test_two_choices_stream_each_their_own_calls() -> None:
    req = request(tools=[WEATHER], tool_choice="auto", n=2,
                  stream_options={"include_usage": True})
    texts = ["A.\n" + CALL, "Just text."]
    chunks = await collect(stream_sse(req, [events(req, t, 3) for t in texts], "m"))
    assert joined(chunks, 0)["tool_calls"] and joined(chunks, 1)["content"] == "Just text."
    assert not joined(chunks, 1)["tool_calls"]
    assert chunks[-2]["usage"]["completion_tokens"] == sum(len(t) for t in texts)
    # ooo_spec is choice 0's, its ids the stream's.
    assert chunks[-2]["ooo_spec"]["tool_results"][0]["tool_call_id"] == [
        c["id"] for c in joined(chunks, 0)["tool_calls"].values()][0]
