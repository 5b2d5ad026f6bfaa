"""One POST request's way through the router (app/api/request_flow.py), with a scripted main
model and no Ray: admission before the body, the slot held by a stream until it closes and
released on every other exit, the `n`-choice fan-out, errors before the first event as their
own status."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api import request_checks
from app.api.auth import ApiKeys
from app.api.chat_service import ChatService
from app.api.completions import CompletionService
from app.api.errors import ApiError
from app.api.request_flow import Incoming, JsonReply, RequestFlow, StreamReply
from app.check_pool import CheckPool, PoolState, stop_if_abandoned
from app.config import AppConfig
from app.speculation.turn import TurnDelta, TurnEvent
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


# ----- issue 39: bodies that never arrive, the router's checks in a fair pool ------------------

def keyed_flow(main: Main, config: dict[str, Any], pool: CheckPool | None = None) -> RequestFlow:
    app_config = AppConfig.model_validate(config)
    keys = ApiKeys.from_config(app_config.auth, {})
    return RequestFlow(app_config, keys, ChatService("m", False), CompletionService("m"),
                       no_sidecar, main, sidecar_deployed=False, check_pool=pool)


def as_key(key: str, path: str, data: dict[str, Any]) -> Incoming:
    raw = json.dumps(data).encode()

    async def body() -> AsyncIterator[bytes]:
        yield raw

    return Incoming(path, {"authorization": f"Bearer {key}"}, body())


# A broken product hangs here; the mark turns that into a failure.
@pytest.mark.timeout(60)
async def test_a_body_that_stalls_is_a_408_and_releases_its_slot() -> None:
    """The slot is taken before the body is read; a body that stops arriving must not hold it
    until the request deadline. `router.body_timeout_s` is tiny here; the verdict is the 408
    and the free slot, not a time."""
    main = Main()
    router = flow(main)
    router.config.router.body_timeout_s = 0.05
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"messages": ['  # half of it, then nothing more
        await never.wait()

    with pytest.raises(ApiError) as caught:
        await router.chat_completions(Incoming("/v1/chat/completions", {}, stalled()))
    assert (caught.value.status, caught.value.code) == (408, "body_timeout")
    assert router.limiter.in_flight("anonymous") == 0 and main.payloads == []
    assert isinstance(await router.chat_completions(incoming(
        "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})), JsonReply)


SLOW = "slow-to-check"


# A broken product hangs here; the mark turns that into a failure.
@pytest.mark.timeout(60)
async def test_one_tenants_flood_of_slow_schemas_leaves_anothers_check_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39's fairness on the router's checks, with the real CheckPool: key A floods slow
    `response_format` schemas (a stand-in for a slow pattern compile, that spends CPU and checks
    in between its steps like the real checks), key B sends a fresh schema. B is answered
    while the flood is still being refused; every flood request is refused with the bound's
    error (`request_too_complex`: `limits.schema_check_timeout_s` of CPU time) and none is
    left hanging."""
    real = request_checks.check_output_schema
    lock, running, most = threading.Lock(), [0], [0]
    stopped = threading.Semaphore(0)
    test_over = threading.Event()  # ends the stand-in if the product never stops it

    def check_output_schema(schema: dict[str, Any], limits: Any) -> None:
        if SLOW in json.dumps(schema):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                while not test_over.is_set():  # one compile step after another until refused
                    stop_if_abandoned()
            finally:
                with lock:
                    running[0] -= 1
                stopped.release()
        real(schema, limits)

    monkeypatch.setattr(request_checks, "check_output_schema", check_output_schema)
    main = Main()
    router = keyed_flow(main, {
        "auth": {"api_keys": [{"key": "flooding-key", "name": "a"},
                              {"key": "innocent-key", "name": "b"}]},
        "limits": {"schema_check_timeout_s": 0.1, "check_threads": 2,
                   "check_threads_per_tenant": 1},
    })

    def slow_request(index: int) -> dict[str, Any]:
        schema = {"type": "object", "properties": {
            "x": {"type": "string", "pattern": f"^{SLOW}-{index}$"}}}
        return {"messages": MESSAGES, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}

    flood = [asyncio.ensure_future(router.chat_completions(
        as_key("flooding-key", "/v1/chat/completions", slow_request(i)))) for i in range(6)]
    fresh = {"type": "object", "properties": {"city": {"type": "string"}}}
    reply = await router.chat_completions(as_key("innocent-key", "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "fresh", "schema": fresh}}}))
    assert isinstance(reply, JsonReply)
    assert not all(task.done() for task in flood)  # answered before the flood's last refusal
    outcomes = await asyncio.gather(*flood, return_exceptions=True)
    assert all(isinstance(o, ApiError) and o.code == "request_too_complex" for o in outcomes)
    # Refused work stopped (at its next step), and the flood never held more than its share.
    try:
        assert all([await asyncio.to_thread(stopped.acquire, True, 30) for _ in flood])
    finally:
        test_over.set()
    assert most[0] == 1
    assert router.limiter.in_flight("a") == 0 and router.limiter.in_flight("b") == 0
    assert len(main.payloads) == 1  # only B's request reached the model


# A broken product hangs here; the mark turns that into a failure.
@pytest.mark.timeout(60)
async def test_keys_that_share_a_tenant_share_one_share_of_the_check_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fairness per tenant, not per key: a client with two keys of one tenant holds one
    check thread (`check_threads_per_tenant`), not two."""
    release = threading.Event()
    real = request_checks.check_output_schema

    def held(schema: dict[str, Any], limits: Any) -> None:
        if SLOW in json.dumps(schema):
            assert release.wait(30)
        real(schema, limits)

    monkeypatch.setattr(request_checks, "check_output_schema", held)
    pool = CheckPool(2, 1, "test-router-checks")
    router = keyed_flow(Main(), {"auth": {"api_keys": [
        {"key": "first-key-of-acme", "tenant": "acme"},
        {"key": "second-key-of-acme", "tenant": "acme"}]}}, pool)
    tenant = router.authorize({"authorization": "Bearer first-key-of-acme"}).tenant
    assert router.authorize({"authorization": "Bearer second-key-of-acme"}).tenant == tenant
    body = {"messages": MESSAGES, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": SLOW}}}}}}
    first = asyncio.ensure_future(router.chat_completions(
        as_key("first-key-of-acme", "/v1/chat/completions", body)))
    second = asyncio.ensure_future(router.chat_completions(
        as_key("second-key-of-acme", "/v1/chat/completions", {**body, "max_tokens": 3})))
    state = await wait_for_pool(pool, lambda s: s.queued.get(tenant) == 1)
    assert state.running == {tenant: 1}  # one thread for the tenant, the other key queued
    release.set()
    assert all(isinstance(r, JsonReply) for r in await asyncio.gather(first, second))


async def wait_for_pool(pool: CheckPool, wanted: Any) -> PoolState:
    pause = threading.Event()
    while not wanted(pool.state()):
        await asyncio.to_thread(pause.wait, 0.01)  # let the pool's threads move, look again
    return pool.state()


async def test_a_suffix_scope_is_a_400_unless_the_config_allows_it() -> None:
    """Each `suffix_scope` is an index of the caller's tenant: a benchmark switch, open only
    where `diagnostics.suffix_scopes` is set (off by default)."""
    scoped = {"messages": MESSAGES, "max_tokens": 4,
              "ooo_spec": {"diagnostics": {"suffix_scope": "bench:ooo"}}}
    main = Main()
    router = flow(main)
    for path, method, data in (("/v1/chat/completions", "chat_completions", scoped),
                               ("/v1/responses", "responses",
                                {"input": "hi", "ooo_spec": scoped["ooo_spec"]})):
        with pytest.raises(ApiError) as caught:
            await getattr(router, method)(incoming(path, data))
        assert (caught.value.status, caught.value.code) == (400, "diagnostics_disabled")
    assert main.payloads == [] and router.limiter.in_flight("anonymous") == 0
    allowed = keyed_flow(main, {"diagnostics": {"suffix_scopes": True}})
    assert isinstance(await allowed.chat_completions(incoming("/v1/chat/completions", scoped)),
                      JsonReply)


@pytest.mark.timeout(120)
async def test_real_slow_patterns_are_refused_and_the_refused_check_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No stand-in: `response_format` schemas of many case-insensitive Unicode patterns (RE2
    compiles each in ~10 ms; hundreds fit in one schema). Each flood request is refused with
    the bound's error, and its check stops at the next pattern instead of compiling the rest;
    another key's request is answered."""
    from app.speculation import schema_limits

    compiled: list[str] = []
    real = schema_limits.compile_re2

    def counting(pattern: str) -> Any:
        compiled.append(pattern)
        return real(pattern)

    monkeypatch.setattr(schema_limits, "compile_re2", counting)
    router = keyed_flow(Main(), {
        "auth": {"api_keys": [{"key": "flooding-key"}, {"key": "innocent-key"}]},
        "limits": {"schema_check_timeout_s": 0.2},
    })
    patterns = 400

    def slow(index: int) -> dict[str, Any]:
        properties = {f"p{i}": {"type": "string", "pattern": f"(?i)r{index}p{i}"
                                + "[\u0100-\u024f]{1,60}" * 6} for i in range(patterns)}
        return {"messages": MESSAGES, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": {
                "type": "object", "properties": properties}}}}

    flood = [asyncio.ensure_future(router.chat_completions(
        as_key("flooding-key", "/v1/chat/completions", slow(i)))) for i in range(3)]
    reply = await router.chat_completions(as_key("innocent-key", "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 4}))
    assert isinstance(reply, JsonReply)
    outcomes = await asyncio.gather(*flood, return_exceptions=True)
    assert all(isinstance(o, ApiError) and o.code == "request_too_complex" for o in outcomes)
    await wait_for_pool(router.check_pool, lambda s: not s.running and not s.queued)
    # Each refused check stopped early: far fewer compiles than the flood's patterns.
    assert len(compiled) < len(flood) * patterns // 2
