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
from app.api.streaming import choice_chunks
from app.formats.reasoning import ReasoningParserName
from app.formats.tool_formats import get_format

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


def test_reasoning_items_become_the_next_assistant_turns_reasoning() -> None:
    """Issue 41: an agent sends a thinking model's earlier reasoning back as `reasoning`
    items; the assistant turn after each gets it (its text, else its summary)."""
    request = parse(tools=[TOOL], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                         "text": "Call the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "summary": [], "content": [
            {"type": "reasoning_text", "text": "It is sunny."}]},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
    ])
    chat = to_chat_request(request)
    assert [(m.role, m.reasoning) for m in chat.messages] == [
        ("user", None), ("assistant", "Call the tool."), ("tool", None),
        ("assistant", "It is sunny."), ("user", None)]


def test_text_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat_request(parse(input="hi", text={"format": {
        "type": "json_schema", "name": "A", "schema": schema, "strict": True}}))
    assert chat.output_schema == schema
    assert to_chat_request(parse(input="hi", text={"format": {"type": "json_object"}})
                           ).output_schema == {"type": "object"}


@pytest.mark.parametrize("data, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "stored responses are not supported"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "type 'web_search_call'"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "hi", "reasoning": {"effort": "huge"}}, "reasoning"),
    ({"input": "hi", "store": True}, "store: true"),
    ({"input": "hi", "include": ["web_search_call.results"]}, "built-in tools"),
    ({"input": "hi", "include": ["nope"]}, "include 'nope'"),
    ({"input": "hi", "tools": [{"type": "custom", "name": "patch", "format": {
        "type": "grammar", "syntax": "lark", "definition": "start: /x/"}}]}, "grammar"),
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


async def run(request: Any, items: list[tuple[str, dict[str, Any]]],
              reasoning_parser: ReasoningParserName | None = None) -> list[dict[str, Any]]:
    """The stream's events, through the chat chunks the route translates (the main model's
    output read as it is decoded: hermes calls, `reasoning_parser`)."""
    async def events() -> AsyncIterator[tuple[str, dict[str, Any]]]:
        for item in items:
            yield item

    chunks = choice_chunks(to_chat_request(request), events(), "m", get_format("hermes"),
                           reasoning_parser)
    out = []
    async for line in stream_events(request, chunks, "m"):
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


async def test_a_thinking_model_streams_its_reasoning_item_then_the_message() -> None:
    """Without tools the text streams as it is decoded, and a thinking model's reasoning is
    an item of its own, streamed first (not the message's text)."""
    final = completion("Sunny.", [])
    final["choices"][0]["message"]["reasoning"] = "Let me see."
    got = await run(parse(input="hi", stream=True, reasoning={"effort": "high"}),
                    [("delta", {"text": "Let me"}), ("delta", {"text": " see.</think>"}),
                     ("delta", {"text": "Sunny."}), ("final", final)], "qwen3")
    kinds = [e["type"] for e in got]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[5]["text"] == "Let me see." and got[10]["text"] == "Sunny."
    assert [e["output_index"] for e in got[2:13]] == [0] * 5 + [1] * 6
    output = got[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["id"] == got[2]["item"]["id"] and output[1]["id"] == got[7]["item"]["id"]
    assert output[0]["content"][0]["text"] == "Let me see."


CODEX = {
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
         "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "done"},
    ],
    "store": False, "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "conv-1",
    "parallel_tool_calls": False, "top_k": 20,
    "tools": [{"type": "custom", "name": "apply_patch", "description": "Patch files",
               "format": {"type": "text"}},
              {"type": "function", "name": "shell", "parameters": {
                  "type": "object", "properties": {"cmd": {"type": "string"}}}}],
}


def test_a_codex_shaped_request_runs_as_chat() -> None:
    """Issue 42: what Codex sends. `reasoning.effort` is the template's thinking switch,
    `prompt_cache_key` the affinity key, a custom tool the function shim vLLM shows it as,
    and its earlier call goes back as that shim's arguments."""
    chat = to_chat_request(parse(**CODEX))
    assert chat.chat_template_kwargs == {"reasoning_effort": "low", "enable_thinking": True}
    assert chat.prompt_cache_key == "conv-1" and chat.affinity_key() == "conv-1"
    assert chat.parallel_tool_calls is False and chat.top_k == 20
    shim = chat.tool_schemas()["apply_patch"]
    assert shim["required"] == ["input"] and shim["properties"]["input"]["type"] == "string"
    call = chat.messages[1].tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"input": "*** Begin Patch"}
    assert chat.messages[2].role == "tool" and chat.messages[2].content == "done"


def test_custom_calls_and_reasoning_come_back_as_their_items() -> None:
    request = parse(**CODEX)
    answer = completion(None, [("apply_patch", json.dumps({"input": "*** Begin Patch"})),
                               ("shell", '{"cmd": "ls"}')])
    answer["choices"][0]["message"]["reasoning"] = "Think first."
    body = ResponseBuilder(request, "m").final(answer)
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "custom_tool_call", "function_call"]
    reasoning, custom, _ = body["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Think first."}]
    assert reasoning["encrypted_content"] is None  # include: nothing is encrypted or stored
    assert custom["input"] == "*** Begin Patch" and custom["call_id"] == "call_0"
    assert body["store"] is False and body["prompt_cache_key"] == "conv-1"


async def test_a_stream_sends_reasoning_and_custom_calls_as_their_items() -> None:
    request = parse(**{**CODEX, "stream": True})
    answer = completion(None, [("apply_patch", json.dumps({"input": "*** Begin Patch"}))])
    answer["choices"][0]["message"]["reasoning"] = "Think."
    got = await run(request, [("delta", {"text": "Think."}), ("delta", {"text": "</think>"}),
                              ("final", answer)], "qwen3")
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done", "response.output_item.done",
        "response.completed"]
    assert [e.get("output_index") for e in got[2:10]] == [0, 0, 0, 0, 1, 1, 1, 1]
    final = got[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["reasoning", "custom_tool_call"]
    assert final[0]["id"] == got[5]["item"]["id"]  # the same item, streamed and final
    assert final[1]["input"] == "*** Begin Patch"
