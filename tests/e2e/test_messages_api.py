"""The Messages API against the running app (the session's, tests/conftest.py) with the real
`anthropic` SDK: a forced tool call as a `tool_use` block, the same streamed, a `tool_result`
round trip, count_tokens against the prompt a request decodes, and an Anthropic-shaped 400.

A 135M model writes what it writes; the assertions check the API surface and the calls it is
forced to make. Few requests, few tokens: the suite's time is tight."""

from __future__ import annotations

import anthropic
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
WEATHER = {"name": "get_weather", "description": "Get the current weather for a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(app_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=app_url, api_key="unused", timeout=180, max_retries=0)


def test_a_forced_tool_use_created_streamed_and_answered(client: anthropic.Anthropic) -> None:
    # The SDK (2.16) has no `temperature` argument any more: clients send it as an extra field.
    asked = {"model": MODEL, "max_tokens": 48, "messages": ASK, "tools": [WEATHER],
             "tool_choice": {"type": "any"}, "extra_body": {"temperature": 0}}
    message = client.messages.create(**asked)  # type: ignore[arg-type]
    assert message.stop_reason == "tool_use"
    calls = [b for b in message.content if b.type == "tool_use"]
    assert calls and calls[0].name == "get_weather" and isinstance(calls[0].input, dict)
    assert calls[0].id.startswith("toolu_")
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    assert message.usage.output_tokens > 0
    assert (message.model_extra or {})["ooo_spec"]["outcome"]  # the report, as on chat

    # The same, streamed: greedy, so the same call, read event by event.
    with client.messages.stream(**asked) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (c.name, c.input) for c in calls]
    assert streamed.usage.output_tokens == message.usage.output_tokens

    # The call's result back as a `tool_result` block: the model reads it and answers.
    answer = client.messages.create(
        model=MODEL, max_tokens=16, tools=[WEATHER],  # type: ignore[list-item]
        extra_body={"temperature": 0},
        messages=[*ASK, {"role": "assistant", "content": message.content},  # type: ignore[list-item]
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": calls[0].id,
                                                "content": "Sunny, 18 C"}]}])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content and answer.usage.output_tokens <= 16
    prompt = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    first = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert prompt > first  # the call and its result are in the prompt


def test_count_tokens_is_the_prompt_a_request_decodes(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(
        model=MODEL, messages=ASK, system="Answer briefly.",  # type: ignore[arg-type]
        tools=[WEATHER])  # type: ignore[list-item]
    decoded = client.messages.create(
        model=MODEL, max_tokens=1, messages=ASK, system="Answer briefly.",  # type: ignore[arg-type]
        tools=[WEATHER])  # type: ignore[list-item]
    usage = decoded.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    bare = client.messages.count_tokens(model=MODEL, messages=ASK)  # type: ignore[arg-type]
    assert 0 < bare.input_tokens < counted.input_tokens


def test_a_bad_request_is_an_anthropic_400(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=8, messages=ASK,  # type: ignore[arg-type]
                               tool_choice={"type": "any"})
    assert caught.value.status_code == 400
    assert caught.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "tool_choice 'any' needs at least one tool in 'tools'"}}
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-nope", max_tokens=8,  # type: ignore[arg-type]
                               messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
