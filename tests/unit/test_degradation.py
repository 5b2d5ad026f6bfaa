"""ChatService under failure: the sidecar is stopped once its prediction is moot, a request that
ends early stops both calls, and a failed sidecar only costs the speculation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.agent_loop import SidecarStart
from app.api.chat_service import ChatService
from app.api.errors import ApiError
from app.api.limits import with_deadline
from app.openai_models import ChatCompletionRequest, MainReport
from app.speculation.turn import SidecarStatus, TurnDelta, TurnResult
from tests.unit.turns import turn_result

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}


def request() -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "look up alpha"}],
        "tools": [TOOL], "tool_choice": "required"})


def final(status: SidecarStatus) -> TurnResult:
    return turn_result([{"name": "lookup", "arguments": {"key": "alpha"}}], "",
                       main=MainReport(steps=5, completion_tokens=5), sidecar=status,
                       sidecar_ms=0.0, main_ms=1.0)


class Calls:
    """A sidecar that never answers and a main model that decodes `steps` deltas (with `hang`,
    then decodes on until cancelled: it never ends on its own)."""

    def __init__(self, steps: int, status: SidecarStatus = "late", hang: bool = False) -> None:
        self.steps = steps
        self.hang = hang
        self.status = status
        self.sidecar_cancels = 0
        self.main_closed = False

    async def start_sidecar(self, payload: dict[str, Any]) -> SidecarStart:
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def cancel() -> None:
            self.sidecar_cancels += 1
            never.cancel()

        return SidecarStart(token="ref", prediction=never, cancel=cancel)

    async def main_events(self, payload: dict[str, Any], token: Any) -> AsyncIterator[Any]:
        try:
            for _ in range(self.steps):
                await asyncio.sleep(0)  # a decoding step's turn of the loop; not a wait
                yield TurnDelta("x")
            if self.hang:
                await asyncio.Event().wait()  # nothing sets it
            yield final(self.status)
        finally:
            self.main_closed = True


def service() -> ChatService:
    return ChatService("m", sidecar_enabled=True)


async def test_sidecar_is_cancelled_once_the_main_call_is_done() -> None:
    calls = Calls(steps=3)
    events = [kind async for kind, _ in service().events(request(), calls.start_sidecar,
                                                          calls.main_events)]
    assert events == ["delta"] * 3 + ["final"]
    assert calls.sidecar_cancels == 1


@pytest.mark.parametrize("status, outcome", [("late", "sidecar_late"),
                                             ("error", "sidecar_error")])
async def test_a_missing_sidecar_answer_is_reported_not_fatal(status: str, outcome: str) -> None:
    calls = Calls(steps=2, status=status)
    completion = None
    async for kind, event in service().events(request(), calls.start_sidecar, calls.main_events):
        if kind == "final":
            completion = event
    assert completion is not None
    assert completion["ooo_spec"]["outcome"] == outcome
    assert completion["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


async def test_a_dropped_request_stops_main_and_sidecar() -> None:
    calls = Calls(steps=1, hang=True)
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in service().events(request(), calls.start_sidecar, calls.main_events):
            seen.set()

    task = asyncio.ensure_future(consume())
    await seen.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls.main_closed
    assert calls.sidecar_cancels == 1


async def test_the_deadline_stops_main_and_sidecar() -> None:
    calls = Calls(steps=1, hang=True)  # only the deadline can end the request

    async def drain() -> None:
        async for _ in with_deadline(
            service().events(request(), calls.start_sidecar, calls.main_events), 0.1
        ):
            pass

    with pytest.raises(ApiError) as caught:
        await asyncio.wait_for(drain(), 30)  # a bound on waiting: a deadline must fire
    assert caught.value.code == "deadline_exceeded"
    assert calls.main_closed
    assert calls.sidecar_cancels == 1


async def test_a_request_can_skip_the_sidecar_and_still_speculate() -> None:
    """`ooo_spec.sidecar: false`: no sidecar call, the main call still speculates."""
    calls = Calls(steps=2)
    started: list[dict[str, Any]] = []

    async def start_sidecar(payload: dict[str, Any]) -> SidecarStart:
        started.append(payload)
        return await calls.start_sidecar(payload)

    seen: list[dict[str, Any]] = []

    async def main_events(payload: dict[str, Any], token: Any) -> AsyncIterator[Any]:
        seen.append(payload)
        async for event in calls.main_events(payload, token):
            yield event

    body = request().model_dump(exclude_none=True)
    skip = ChatCompletionRequest.model_validate({**body, "ooo_spec": {"sidecar": False}})
    async for _ in service().events(skip, start_sidecar, main_events):
        pass
    assert started == [] and calls.sidecar_cancels == 0
    assert seen and seen[0]["ooo_spec"]["enabled"] is True
    async for _ in service().events(request(), start_sidecar, main_events):
        pass
    assert len(started) == 1
