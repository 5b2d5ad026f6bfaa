"""The Messages API (app/api/messages.py) without Ray: a Messages request as the chat request it
runs as, a chat completion as a `message`, the chat chunks as the Messages event sequence, and
the route through the router's flow (checks, keys, `x-api-key`) with a scripted main model.
The real `anthropic` SDK reads what the route answers, over an in-process transport: the
bodies and events are the ones its clients parse. The wire models are held to vLLM's own
(`vllm.entrypoints.anthropic.protocol`) on sample bodies."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2
import pytest

from app.api import messages
from app.api.auth import ApiKeys
from app.api.chat_service import ChatService
from app.api.completions import CompletionService
from app.api.errors import ApiError
from app.api.messages import (
    CountTokensRequest,
    MessagesRequest,
    count_chat_request,
    to_chat_request,
    to_message,
)
from app.api.request_checks import ROUTES, Bounds, check_body
from app.api.request_flow import Incoming, JsonReply, RequestFlow, StreamReply
from app.check_pool import CheckPool
from app.config import AppConfig, LimitsConfig
from app.engine.vllm_engine import GenerationTally, StepDelta
from app.main_model.service import MainModelService
from app.openai_models import MainReport
from app.speculation.turn import TurnDelta, TurnEvent
from app.tenancy import TENANT_KEY
from tests.unit.fake_engine import FakeEngine
from tests.unit.turns import turn_result

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def request(**extra: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 16, "messages": USER,
                                           **extra})


def refused(**extra: Any) -> ApiError:
    """The 400 the route's checks answer to a body."""
    data = {"model": "m", "max_tokens": 16, "messages": USER, **extra}
    with pytest.raises(ApiError) as caught:
        check_body(ROUTES["/v1/messages"], json.dumps(data).encode(),
                   Bounds(LimitsConfig(), 1_000_000, 2048))
    assert caught.value.status == 400, caught.value.message
    return caught.value


# ----- the request as chat ------------------------------------------------------------------
def test_a_conversation_with_a_tool_round_trip_becomes_chat_messages() -> None:
    chat = to_chat_request(request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look it up", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ]))
    assert chat.message_dicts() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        # The earlier thoughts are dropped, as the templates drop them.
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat.tool_dicts() == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": WEATHER["input_schema"]}}]
    assert chat.max_tokens == 16 and chat.effective_tool_choice == "auto"


@pytest.mark.parametrize(("choice", "mode", "named"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "tool", "name": "get_weather"}, "named", "get_weather"),
    ({"type": "none"}, "none", None),
])
def test_tool_choice_maps_to_chats(choice: dict[str, Any], mode: str, named: str | None) -> None:
    chat = to_chat_request(request(tools=[WEATHER], tool_choice=choice))
    assert (chat.effective_tool_choice, chat.named_tool) == (mode, named)
    assert chat.parallel_tool_calls is None
    one = to_chat_request(request(tools=[WEATHER], tool_choice={
        **choice, "disable_parallel_tool_use": True}))
    assert one.parallel_tool_calls is False


def test_sampling_stop_thinking_metadata_and_format_map_through() -> None:
    chat = to_chat_request(request(
        temperature=0.2, top_p=0.9, stop_sequences=["\n\nHuman:"], stream=True,
        metadata={"user_id": "u-1"}, thinking={"type": "disabled"},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        ooo_spec={"sidecar": False}))
    assert (chat.temperature, chat.top_p, chat.stop, chat.stream) == (
        0.2, 0.9, ["\n\nHuman:"], True)
    assert chat.user == "u-1" and chat.ooo_spec.sidecar is False
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    assert chat.output_schema == {"type": "object"}
    thinking = to_chat_request(request(max_tokens=4096, thinking={
        "type": "enabled", "budget_tokens": 1024}))
    assert thinking.chat_template_kwargs == {"enable_thinking": True}
    # An explicit template switch wins; without `thinking` the template's default holds.
    assert to_chat_request(request(thinking={"type": "adaptive"}, chat_template_kwargs={
        "enable_thinking": False})).chat_template_kwargs == {"enable_thinking": False}
    assert to_chat_request(request()).chat_template_kwargs is None


def test_top_k_maps_through_or_is_refused_by_name() -> None:
    assert to_chat_request(request(top_k=0)).model_dump().get("top_k") in (0, None)  # off
    if messages.top_k_supported():
        assert to_chat_request(request(top_k=5)).model_dump()["top_k"] == 5
    else:
        err = refused(top_k=5)
        assert err.param == "top_k" and "top_k" in err.message


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, None),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}]}, "messages.0.content"),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, None),
    ({"max_tokens": 0}, "max_tokens"),
    ({"frequency": 1}, "frequency"),
])
def test_what_cannot_be_served_is_a_400_naming_it(extra: dict[str, Any],
                                                  param: str | None) -> None:
    err = refused(**extra)
    if param is not None:
        assert err.param is not None and err.param.startswith(param), (err.param, err.message)


def test_count_tokens_asks_one_token_of_the_same_prompt() -> None:
    body = {"model": "m", "messages": USER, "tools": [WEATHER], "system": "Be brief."}
    chat = count_chat_request(CountTokensRequest.model_validate(body))
    assert chat.max_tokens == 1 and chat.tool_dicts()[0]["function"]["name"] == "get_weather"
    assert chat.message_dicts() == to_chat_request(request(**body)).message_dicts()
    checked = check_body(ROUTES["/v1/messages/count_tokens"], json.dumps(body).encode(),
                         Bounds(LimitsConfig(), 1_000_000, 2048))
    assert checked.engine_requests == 1


# ----- the response -------------------------------------------------------------------------
def completion(message: dict[str, Any], finish: str, cached: int = 0,
               stop: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if stop is not None:
        choice["stop_reason"] = stop
    return {"choices": [choice], "ooo_spec": {"outcome": "hit"},
            "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def test_a_completion_becomes_a_message() -> None:
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = to_message(completion({"role": "assistant", "content": "Sure.", "reasoning": "hm",
                                  "tool_calls": [call]}, "tool_calls", cached=16), "m")
    assert body["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather",
         "input": {"city": "Paris"}}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("tool_use", None)
    # Anthropic's input_tokens leave out what the prefix cache served.
    assert body["usage"] == {"input_tokens": 14, "output_tokens": 7,
                             "cache_read_input_tokens": 16}
    assert body["ooo_spec"] == {"outcome": "hit"} and body["id"].startswith("msg_")
    parsed = anthropic.types.Message.model_validate(body)
    assert parsed.content[2].type == "tool_use"


@pytest.mark.parametrize(("finish", "stop", "expected"), [
    ("stop", None, ("end_turn", None)),
    ("stop", "END", ("stop_sequence", "END")),
    ("length", None, ("max_tokens", None)),
    ("tool_calls", None, ("tool_use", None)),
])
def test_stop_reasons(finish: str, stop: str | None, expected: tuple[str, str | None]) -> None:
    body = to_message(completion({"role": "assistant", "content": "x"}, finish, stop=stop), "m")
    assert (body["stop_reason"], body["stop_sequence"]) == expected


def test_errors_take_anthropics_envelope() -> None:
    assert messages.error_body(400, "bad") == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    kinds = {status: messages.error_body(status, "x")["error"]["type"]
             for status in (401, 404, 413, 429, 500, 503, 504)}
    assert kinds == {401: "authentication_error", 404: "not_found_error",
                     413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                     503: "overloaded_error", 504: "timeout_error"}
    assert messages.is_messages_path("/v1/messages/count_tokens")
    assert not messages.is_messages_path("/v1/messagesx")


# ----- through the router's flow, read by the SDK -------------------------------------------
class Main:
    """The main replica, scripted: `pieces` as its steps, then the turn's result."""

    def __init__(self, pieces: list[str], stop: str | None = None, **result: Any) -> None:
        self.pieces = pieces
        self.stop = stop  # the stop string vLLM reports as having ended the output
        self.result = result
        self.payloads: list[dict[str, Any]] = []

    async def __call__(self, payload: dict[str, Any], sidecar_ref: Any,
                       raw_prompt: Any = None) -> AsyncIterator[TurnEvent]:
        self.payloads.append(payload)
        for piece in self.pieces:
            yield TurnDelta(piece)
        yield dataclasses.replace(turn_result(text="".join(self.pieces), **self.result),
                                  stop_reason=self.stop)


async def no_sidecar(payload: dict[str, Any]) -> None:
    return None


def flow(main: Main, config: dict[str, Any] | None = None,
         counted: list[dict[str, Any]] | None = None) -> RequestFlow:
    app_config = AppConfig.model_validate(config or {})

    async def count(payload: dict[str, Any]) -> int:
        if counted is not None:
            counted.append(payload)
        return len(payload["messages"]) * 10

    return RequestFlow(app_config, ApiKeys.from_config(app_config.auth, {}),
                       ChatService("m", False), CompletionService("m"), no_sidecar, main,
                       sidecar_deployed=False, count_call=count)


def sdk(router: RequestFlow, headers: dict[str, str] | None = None,
        **client: Any) -> anthropic.Anthropic:
    """The real SDK over a transport that hands each request to `router`, in a loop of its
    own (the SDK is synchronous)."""

    def handle(http: httpx2.Request) -> httpx2.Response:
        async def answer() -> httpx2.Response:
            async def body() -> AsyncIterator[bytes]:
                yield http.content

            path = http.url.path
            method = router.count_tokens if path.endswith("/count_tokens") else router.messages
            try:
                reply = await method(Incoming(path, http.headers, body()))
            except ApiError as err:
                return httpx2.Response(err.status, json=messages.error_body(err.status,
                                                                           err.message))
            if isinstance(reply, JsonReply):
                return httpx2.Response(200, json=reply.body)
            assert isinstance(reply, StreamReply)
            try:
                text = "".join([chunk async for chunk in reply.chunks])
            finally:
                await reply.close()
            return httpx2.Response(200, content=text.encode(),
                                  headers={"content-type": "text/event-stream"})

        return asyncio.run(answer())

    return anthropic.Anthropic(
        base_url="http://router",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handle)), max_retries=0,
        default_headers=headers, **client)


def called(main: Main, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 32, "messages": USER, "tools": [WEATHER],
            "tool_choice": {"type": "any"}, **extra}


def test_the_sdk_gets_a_tool_use_and_the_flow_runs_it_as_chat() -> None:
    main = Main([CALL_TEXT], calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
                finish_reason="stop", prompt_tokens=30, completion_tokens=12)
    client = sdk(flow(main), api_key="unused")
    message = client.messages.create(**called(main))
    assert message.stop_reason == "tool_use"
    block = message.content[-1]
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input == {"city": "Paris"} and block.id.startswith("toolu_")
    assert message.usage.input_tokens == 30 and message.usage.output_tokens == 12
    assert (message.model_extra or {})["ooo_spec"]["enabled"] is False
    payload = main.payloads[0]
    assert payload["tool_choice"] == "required" and payload[TENANT_KEY] == "anonymous"


def test_the_sdk_streams_a_tool_use_event_by_event() -> None:
    pieces = ["<tool_call>\n", '{"name": "get_weather", ', '"arguments": {"city": ',
              '"Paris"}}\n</tool_call>']
    main = Main(pieces, calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
                prompt_tokens=30, completion_tokens=12,
                main=MainReport(cached_tokens=16, completion_tokens=12))
    client = sdk(flow(main), api_key="unused")
    with client.messages.stream(**called(main, tool_choice={"type": "auto"})) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and kinds.count("content_block_start") == 1
    assert kinds.index("content_block_stop") < kinds.index("message_delta")
    (block,) = final.content
    assert block.type == "tool_use" and block.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens,
            final.usage.output_tokens) == (14, 16, 12)


def test_a_thinking_model_streams_a_thinking_block_then_text() -> None:
    main = Main(["Let me see.", "</think>", "Sunny."], content="Sunny.",
                reasoning="Let me see.")
    router = flow(main, {"main": {"engine": {"reasoning_parser": "qwen3"}}})
    client = sdk(router, api_key="unused")
    with client.messages.stream(model="m", max_tokens=2048, messages=USER,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me see." and final.content[1].text == "Sunny."
    assert final.stop_reason == "end_turn"
    assert main.payloads[0]["chat_template_kwargs"] == {"enable_thinking": True}


def test_count_tokens_counts_the_main_models_prompt() -> None:
    counted: list[dict[str, Any]] = []
    client = sdk(flow(Main([]), counted=counted), api_key="unused")
    result = client.messages.count_tokens(model="m", messages=USER, system="Be brief.",
                                          tools=[WEATHER])  # type: ignore[list-item]
    assert result.input_tokens == 20  # the fake counts 10 a message: system + user
    assert counted[0]["tools"][0]["function"]["name"] == "get_weather"
    assert counted[0][TENANT_KEY] == "anonymous"


def test_keys_come_as_x_api_key_or_bearer_and_refusals_are_anthropic_errors() -> None:
    router = flow(Main(["hi"], content="hi"), {"auth": {"api_keys": [{"key": "sk-test-1"}]}})
    ok = sdk(router, api_key="sk-test-1").messages.create(model="m", max_tokens=4,
                                                          messages=USER)
    assert ok.content[0].type == "text" and ok.stop_reason == "end_turn"
    bearer = sdk(router, auth_token="sk-test-1").messages.create(model="m", max_tokens=4,
                                                            messages=USER)
    assert bearer.content
    with pytest.raises(anthropic.AuthenticationError) as denied:
        sdk(router, api_key="sk-test-2").messages.create(model="m", max_tokens=4,
                                                         messages=USER)
    assert denied.value.status_code == 401
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk(router, api_key="sk-test-1").messages.create(
            model="m", max_tokens=4, messages=USER, tool_choice={"type": "any"})
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "tool_choice 'any' needs at least one tool in 'tools'"}}
    with pytest.raises(anthropic.NotFoundError):
        sdk(router, api_key="sk-test-1").messages.create(model="other", max_tokens=4,
                                                         messages=USER)
    assert router.limiter.in_flight("key-" + hashlib.sha256(b"sk-test-1").hexdigest()[:8]) == 0


def test_a_stop_sequence_is_named_created_and_streamed() -> None:
    client = sdk(flow(Main(["Sunny"], stop="END", content="Sunny")), api_key="unused")
    asked = {"model": "m", "max_tokens": 8, "messages": USER, "stop_sequences": ["END"]}
    message = client.messages.create(**asked)  # type: ignore[arg-type]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    with client.messages.stream(**asked) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def test_the_engine_keeps_the_stop_string_that_ended_the_output() -> None:
    tally = GenerationTally(3, 0.0)
    tally.add(StepDelta([1], "a", False, None, 1.0))
    tally.add(StepDelta([2], "b", True, "stop", 2.0, stop_reason="END"))
    assert tally.result().stop_reason == "END"
    by_token = GenerationTally(3, 0.0)
    by_token.add(StepDelta([2], "b", True, "stop", 2.0, stop_reason=7))  # a stop token id
    assert by_token.result().stop_reason is None


async def test_count_prompt_tokens_is_the_prompt_the_main_model_prepares() -> None:
    main = MainModelService(AppConfig(), engine=FakeEngine(["x"]))  # type: ignore[arg-type]
    main.prepare_pool = CheckPool(2, 2, "count-test")
    main._template = (False, frozenset())  # the format's fallback tool prompt
    # One token per character of the messages the format prepares: the tools' prompt counts.
    main.engine.chat_prompt_ids = (  # type: ignore[method-assign]
        lambda messages: list(range(len(json.dumps(messages)))))
    request = to_chat_request(request_with_tools := MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": USER, "tools": [WEATHER]}))
    counted = await main.count_prompt_tokens(request)
    assert counted == len(main.prepare(request).prompt_token_ids) > 0
    plain = to_chat_request(request_with_tools.model_copy(update={"tools": None}))
    assert 0 < await main.count_prompt_tokens(plain) < counted


def test_x_api_key_is_a_key_and_authorization_wins() -> None:
    keys = ApiKeys([("sk-test-1", "one", None), ("sk-test-2", "two", None)], 4)
    assert keys.authenticate(None, "sk-test-1").key_id == "one"
    assert keys.authenticate("Bearer sk-test-2", "sk-test-1").key_id == "two"
    for authorization, api_key in [(None, None), (None, " "), ("Bearer nope", "sk-test-1")]:
        with pytest.raises(ApiError) as denied:
            keys.authenticate(authorization, api_key)
        assert denied.value.status == 401


# ----- the wire models agree with vLLM's ----------------------------------------------------
SAMPLES: list[dict[str, Any]] = [
    {"model": "m", "max_tokens": 64, "messages": USER},
    {"model": "m", "max_tokens": 64, "system": "Be brief.", "stop_sequences": ["END"],
     "temperature": 0.5, "top_p": 0.9, "top_k": 0, "metadata": {"user_id": "u"},
     "messages": [
         {"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": [
             {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
              "input": {"city": "Paris"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}],
     "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}},
    {"model": "m", "max_tokens": 4096, "messages": USER, "stream": True,
     "thinking": {"type": "enabled", "budget_tokens": 2048}, "tools": [WEATHER],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
]


@pytest.mark.parametrize("body", SAMPLES)
def test_the_wire_models_agree_with_vllms(body: dict[str, Any]) -> None:
    protocol = pytest.importorskip("vllm.entrypoints.anthropic.protocol")
    theirs = protocol.AnthropicMessagesRequest.model_validate(body)
    ours = MessagesRequest.model_validate(body)
    fields = ("model", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
              "metadata")
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(theirs, f) for f in fields}
    assert bool(ours.stream) == bool(theirs.stream)
    assert [m.role for m in ours.messages] == [m.role for m in theirs.messages]
    assert ours.model_dump(include={"tools"}, exclude_none=True) == \
        theirs.model_dump(include={"tools"}, exclude_none=True)
    assert ours.model_dump(include={"tool_choice"}, exclude_none=True) == \
        theirs.model_dump(include={"tool_choice"}, exclude_none=True)
    assert (ours.thinking.model_dump() if ours.thinking else None) == (
        theirs.thinking.model_dump() if theirs.thinking else None)
    # The chat conversation both make of it: roles, calls, tool results.
    serving = pytest.importorskip("vllm.entrypoints.anthropic.serving")
    vllm_chat = serving.AnthropicServingMessages.to_chat_completion_request(theirs)
    mine = to_chat_request(ours)

    def shape(message: dict[str, Any]) -> tuple[Any, ...]:
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in message.get("tool_calls") or []]
        return (message["role"], message.get("content") or None, calls,
                message.get("tool_call_id"))

    assert [shape(m) for m in mine.message_dicts()] == [shape(dict(m))
                                                        for m in vllm_chat.messages]
    assert mine.stop == vllm_chat.stop or (not mine.stop and not vllm_chat.stop)
    assert [t["function"]["name"] for t in mine.tool_dicts()] == [
        t.function.name for t in vllm_chat.tools or []]


@pytest.mark.parametrize("body", [
    {"model": "m", "max_tokens": 0, "messages": USER},
    {"model": "m", "max_tokens": 2048, "messages": USER,
     "thinking": {"type": "enabled", "budget_tokens": 4096}},
    {"model": "m", "max_tokens": 16, "messages": USER, "tool_choice": {"type": "tool"}},
])
def test_both_refuse_the_same_bad_bodies(body: dict[str, Any]) -> None:
    protocol = pytest.importorskip("vllm.entrypoints.anthropic.protocol")
    with pytest.raises(ValueError):
        protocol.AnthropicMessagesRequest.model_validate(body)
    with pytest.raises(ValueError):
        MessagesRequest.model_validate(body)
