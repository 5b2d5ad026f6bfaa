"""The Responses API subset: request conversion, the response object, the event sequence."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.errors import ApiError
from app.api.responses import (
    ResponseBuilder,
    parse_responses_request,
    stream_events,
    to_chat_request,
)

TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}


def parse(**data: Any) -> Any:
    return parse_responses_request(json.dumps(data).encode(), 100_000)


def test_items_become_chat_messages() -> None:
    request = parse(instructions="Be brief.", tools=[TOOL],
                    tool_choice={"type": "function", "name": "get_weather"},
                    max_output_tokens=40, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather",
         "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
    ])
    chat = to_chat_request(request)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assert [c.id for c in chat.messages[2].tool_calls or []] == ["call_1", "call_2"]
    assert chat.named_tool == "get_weather" and chat.max_tokens == 40
    assert chat.tools and chat.tools[0].function.parameters == TOOL["parameters"]


def test_text_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat_request(parse(input="hi", text={"format": {
        "type": "json_schema", "name": "A", "schema": schema, "strict": True}}))
    assert chat.output_schema == schema
    assert to_chat_request(parse(input="hi", text={"format": {"type": "json_object"}})
                           ).output_schema == {"type": "object"}


@pytest.mark.parametrize("data, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "stored responses are not supported"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "type 'reasoning'"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "schema"),
])
def test_unsupported_is_a_clear_400(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as err:
        to_chat_request(parse(**data))
    assert err.value.status == 400 and words in err.value.message, err.value.message


def completion(content: str | None, calls: list[tuple[str, str]], finish: str = "stop"
               ) -> dict[str, Any]:
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": name, "arguments": args}}
                  for i, (name, args) in enumerate(calls)]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                      "prompt_tokens_details": {"cached_tokens": 2}},
            "ooo_spec": {"outcome": "hit"}}


def test_response_object() -> None:
    request = parse(input="hi", tools=[TOOL], tool_choice="required")
    out = ResponseBuilder(request, "m").final(completion(None, [("get_weather", "{}")]))
    assert out["object"] == "response" and out["status"] == "completed"
    assert out["output"] == [{"type": "function_call", "id": "fc_0", "call_id": "call_0",
                              "name": "get_weather", "arguments": "{}",
                              "status": "completed"}]
    assert out["usage"]["input_tokens"] == 5 and out["ooo_spec"] == {"outcome": "hit"}
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": 2}
    cut = ResponseBuilder(request, "m").final(completion("abc", [], "length"))
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["output"][0]["content"][0]["text"] == "abc"


async def run(request: Any, items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    async def events() -> AsyncIterator[tuple[str, dict[str, Any]]]:
        for item in items:
            yield item

    out = []
    async for line in stream_events(request, to_chat_request(request), events(), "m"):
        head, data = line.strip().split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert head == f"event: {body['type']}"
        out.append(body)
    return out


async def test_text_stream_event_sequence() -> None:
    got = await run(parse(input="hi", stream=True),
                    [("delta", {"text": "Hel"}), ("delta", {"text": "lo"}),
                     ("final", completion("Hello", []))])
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert got[-4]["text"] == "Hello"


async def test_tool_call_stream_event_sequence() -> None:
    got = await run(parse(input="hi", tools=[TOOL], stream=True),
                    [("delta", {"text": "<tool_call>"}),
                     ("final", completion(None, [("get_weather", '{"city": "Paris"}')]))])
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert got[4]["arguments"] == '{"city": "Paris"}'
    assert got[-1]["response"]["output"][0]["call_id"] == "call_0"
