"""One POST request's way through the router (app/api/request_flow.py), with a scripted main
model and no Ray: admission before the body, the slot held by a stream until it closes and
released on every other exit, the `n`-choice fan-out, errors before the first event as their
own status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.auth import ApiKeys
from app.api.chat_service import ChatService
from app.api.completions import CompletionService
from app.api.errors import ApiError
from app.api.request_flow import Incoming, JsonReply, RequestFlow, StreamReply
from app.config import AppConfig
from app.engine.turn import TurnDelta, TurnEvent
from app.tenancy import TENANT_KEY
from tests.unit.turns import turn_result

MESSAGES = [{"role": "user", "content": "hi"}]


class Main:
    """The main replica, scripted: each call writes 'ok' and records its payload."""

    def __init__(self, fail: ApiError | None = None) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.fail = fail

    async def __call__(self, payload: dict[str, Any], sidecar_ref: Any,
                       raw_prompt: Any = None) -> AsyncIterator[TurnEvent]:
        self.payloads.append(payload)
        if self.fail is not None:
            raise self.fail
        yield TurnDelta("ok")
        yield turn_result([], "ok", text="ok")


async def no_sidecar(payload: dict[str, Any]) -> None:
    return None


def flow(main: Main, **auth: Any) -> RequestFlow:
    config = AppConfig.model_validate({"auth": auth} if auth else {})
    keys = ApiKeys.from_config(config.auth, {})
    return RequestFlow(config, keys, ChatService("m", False), CompletionService("m"),
                       no_sidecar, main, sidecar_deployed=False)


def incoming(path: str, data: dict[str, Any], read: list[int] | None = None) -> Incoming:
    raw = json.dumps(data).encode()

    async def body() -> AsyncIterator[bytes]:
        if read is not None:
            read.append(len(raw))
        yield raw

    return Incoming(path, {"content-length": str(len(raw))}, body())


async def test_chat_choices_fan_out_and_the_slot_is_released() -> None:
    main = Main()
    router = flow(main)
    reply = await router.chat_completions(incoming(
        "/v1/chat/completions", {"messages": MESSAGES, "n": 3, "seed": 7, "max_tokens": 4}))
    assert isinstance(reply, JsonReply)
    assert [c["index"] for c in reply.body["choices"]] == [0, 1, 2]
    assert sorted(p["seed"] for p in main.payloads) == [7, 8, 9]
    assert router.limiter.in_flight("anonymous") == 0


async def test_a_stream_holds_the_slot_until_it_closes() -> None:
    router = flow(Main())
    reply = await router.chat_completions(incoming(
        "/v1/chat/completions", {"messages": MESSAGES, "n": 2, "stream": True, "max_tokens": 4}))
    assert isinstance(reply, StreamReply)
    assert router.limiter.in_flight("anonymous") == 2  # two choices, no sidecar
    text = "".join([chunk async for chunk in reply.chunks])
    assert text.rstrip().endswith("data: [DONE]")
    await reply.close()
    assert router.limiter.in_flight("anonymous") == 0


@pytest.mark.parametrize(("path", "method", "data"), [
    ("/v1/chat/completions", "chat_completions", {"messages": MESSAGES}),
    ("/v1/completions", "completions", {"prompt": "a"}),
])
async def test_a_refused_request_releases_its_slot(path: str, method: str,
                                                   data: dict[str, Any]) -> None:
    main = Main()
    router = flow(main)
    with pytest.raises(ApiError) as caught:
        await getattr(router, method)(incoming(path, {**data, "stop": [""]}))
    assert caught.value.code == "empty_stop_string"
    assert router.limiter.in_flight("anonymous") == 0 and main.payloads == []


async def test_a_caller_at_its_limit_is_refused_before_its_body_is_read() -> None:
    router = flow(Main(), max_concurrent_anonymous=1)
    held = await router.chat_completions(incoming(
        "/v1/chat/completions", {"messages": MESSAGES, "stream": True, "max_tokens": 4}))
    assert isinstance(held, StreamReply)
    read: list[int] = []
    with pytest.raises(ApiError) as caught:
        await router.completions(incoming("/v1/completions", {"prompt": "a"}, read))
    assert caught.value.status == 429 and read == []
    await held.close()
    assert isinstance(await router.completions(incoming("/v1/completions", {"prompt": "a"})),
                      JsonReply)


async def test_completions_carry_the_tenant_and_responses_run_as_chat() -> None:
    main = Main()
    router = flow(main)
    reply = await router.completions(incoming("/v1/completions", {"prompt": "a", "n": 2}))
    assert isinstance(reply, JsonReply) and len(reply.body["choices"]) == 2
    assert all(p[TENANT_KEY] == "anonymous" for p in main.payloads)
    reply = await router.responses(incoming("/v1/responses", {"input": "hi"}))
    assert isinstance(reply, JsonReply) and reply.body["object"] == "response"
    assert reply.body["output"][0]["content"][0]["text"] == "ok"


async def test_an_error_before_the_first_event_is_raised_not_streamed() -> None:
    router = flow(Main(fail=ApiError(503, "down", code="main_unavailable")))
    with pytest.raises(ApiError) as caught:
        await router.chat_completions(incoming(
            "/v1/chat/completions", {"messages": MESSAGES, "stream": True}))
    assert caught.value.status == 503
    assert router.limiter.in_flight("anonymous") == 0
