"""`ooo` never slower than `drafts` where the sidecar adds nothing: a turn that skips the sidecar
(not worth it, or the router's gate busy) makes the same calls as a `drafts` turn
(`ooo_spec.sidecar: false`); a called sidecar's prediction is never waited for before or
during the main call, nor is a sidecar replica taking the call (the main replica makes it,
beside its prefill, and hands the ref back in its stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from app.api.agent_loop import SidecarStart
from app.api.chat_service import ChatService
from app.api.prefix_index import ROUTE_KEY
from app.api.sidecar_gate import SidecarGate
from app.config import SidecarValueConfig
from app.openai_models import ChatCompletionRequest, MainReport, OooSpecReport
from app.speculation.turn import SidecarCalled, TurnDelta
from deployments.router import Router
from tests.unit.turns import turn_result

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
# Measured twice, gaining nothing: from the third request on the sidecar does not pay.
NEVER_PAYS = SidecarValueConfig(min_gain_tokens=2, window=3, min_samples=2, probe_every=100)


def request(sidecar: bool = True) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "look up alpha"}],
        "tools": [TOOL], "tool_choice": "required",
        "ooo_spec": {"pre_execute": False, "sidecar": sidecar}})


class Recorder:
    """The deployment's two calls, in the order the service made them. The sidecar answers
    `token` at once (None: its gate refused the call) with a prediction that never arrives."""

    def __init__(self, token: Any = "ref") -> None:
        self.token = token
        self.calls: list[tuple[str, Any]] = []
        self.never: asyncio.Future[Any] | None = None

    async def start_sidecar(self, payload: dict[str, Any]) -> SidecarStart:
        self.calls.append(("sidecar", None))
        if self.token is None:
            return SidecarStart(token=None)
        never = self.never = asyncio.get_running_loop().create_future()

        def cancel() -> None:
            never.cancel()

        return SidecarStart(token=self.token, prediction=never, cancel=cancel)

    async def main_events(self, payload: dict[str, Any], token: Any) -> AsyncIterator[Any]:
        body = {k: v for k, v in payload.items() if k != ROUTE_KEY}  # a fresh id per turn
        body["ooo_spec"] = {k: v for k, v in body["ooo_spec"].items() if k != "sidecar"}
        self.calls.append(("main", (body, token)))
        yield TurnDelta("x")
        yield turn_result([{"name": "lookup", "arguments": {"key": "alpha"}}], "",
                          main=MainReport(steps=5, completion_tokens=9),
                          sidecar="late" if token is not None else "none",
                          sidecar_ms=0.0, main_ms=1.0)


async def complete(service: ChatService, calls: Recorder,
                   req: ChatCompletionRequest) -> OooSpecReport:
    events = [e async for e in service.events(req, calls.start_sidecar, calls.main_events,
                                              tenant="t")]
    kind, completion = events[-1]
    assert kind == "final"
    return OooSpecReport.model_validate(completion["ooo_spec"])


async def test_a_turn_not_worth_the_sidecar_makes_the_calls_of_a_drafts_turn() -> None:
    service = ChatService("m", sidecar_enabled=True, sidecar_value=NEVER_PAYS)
    measuring = Recorder()
    for _ in range(2):
        await complete(service, measuring, request())
    assert [kind for kind, _ in measuring.calls] == ["sidecar", "main"] * 2
    skipped, drafts = Recorder(), Recorder()
    report = await complete(service, skipped, request())
    await complete(ChatService("m", sidecar_enabled=True), drafts, request(sidecar=False))
    assert report.sidecar_decisions[0].reason == "does_not_pay"
    assert report.outcome == "sidecar_skipped"
    # The same single main call, with the same body and no sidecar token.
    assert skipped.calls == drafts.calls
    assert [kind for kind, _ in skipped.calls] == ["main"] and skipped.calls[0][1][1] is None


async def test_a_turn_the_gate_refuses_goes_as_a_drafts_turn_reported_busy() -> None:
    busy, drafts = Recorder(token=None), Recorder()
    report = await complete(ChatService("m", sidecar_enabled=True), busy, request())
    await complete(ChatService("m", sidecar_enabled=True), drafts, request(sidecar=False))
    assert busy.calls[1:] == drafts.calls  # after the refused start: the drafts turn's call
    assert report.sidecar_decisions[0].call is False
    assert report.sidecar_decisions[0].reason == "busy"
    assert report.outcome == "sidecar_skipped"


async def test_the_main_call_never_waits_for_the_prediction() -> None:
    """The prediction never arrives: the main call is made with the token and the turn ends on
    the main model's result alone (the prediction is dropped, not awaited)."""
    calls = Recorder()
    report = await complete(ChatService("m", sidecar_enabled=True), calls, request())
    assert [kind for kind, _ in calls.calls] == ["sidecar", "main"]
    assert calls.calls[1][1][1] == "ref"
    assert calls.never is not None and calls.never.cancelled()  # freed at the turn's end
    assert report.outcome == "sidecar_late"


async def test_the_routers_gate_refusal_puts_nothing_and_hands_no_token() -> None:
    """Refused by its gate, the deployment's sidecar start returns at once without a token
    (no object put in Ray's store, no sidecar call) and counts the skip."""
    gate = SidecarGate(limit=1)
    assert gate.admit() is not None  # one call pending

    class Sidecar:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the sidecar was called ({name})")

    router = type("R", (), {"sidecar": Sidecar(), "sidecar_gate": gate})()
    deployment: Any = Router  # Serve's `Deployment`; the class it wraps holds the method
    start = await deployment.func_or_class._start_sidecar(router, {})
    assert start is not None and start.token is None and start.prediction is None
    assert gate.skipped == 1 and gate.pending == 1


class StreamingMain:
    """A MainModel handle whose stream hands over `ref` first (None: never), then decodes."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.generate = self
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> AsyncIterator[Any]:
        self.calls.append(args)

        async def events() -> AsyncIterator[Any]:
            if self.ref is not None:
                yield SidecarCalled(self.ref)
            yield TurnDelta("x")
            yield turn_result([], "x", text="x")

        return events()


def deployed_router(main: Any, gate: SidecarGate) -> Any:
    class NoSidecar:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the router called the sidecar ({name})")

    return type("R", (), {"sidecar": NoSidecar(), "sidecar_gate": gate, "_arrivals": set(),
                          "baselines": {}, "main": main})()


async def test_the_router_admits_the_sidecar_call_and_the_main_stream_hands_its_ref_over() -> None:
    """No wait before the main call: the router neither calls the sidecar nor awaits anything
    for it; the main replica makes the call, and the ref it hands back in the stream is the
    prediction pre-execution awaits (by two awaiters at once, one of them cancelled)."""
    gate = SidecarGate(limit=1)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    main = StreamingMain(answer)
    router = deployed_router(main, gate)
    deployment: Any = Router
    start = await deployment.func_or_class._start_sidecar(router, {})
    assert start is not None and start.prediction is not None and gate.pending == 1
    events = [e async for e in deployment.func_or_class._main_events(
        router, {"ooo_spec": {}}, start.token)]
    assert main.calls == [({"ooo_spec": {}}, True)]  # the main replica is asked to call it
    assert [type(e).__name__ for e in events] == ["TurnDelta", "TurnResult"]
    awaiting = asyncio.Event()
    dropped = asyncio.ensure_future(_awaited(start.prediction, awaiting))
    kept = asyncio.ensure_future(_awaited(start.prediction))
    await awaiting.wait()  # `dropped` awaits the prediction now
    dropped.cancel()
    answer.set_result({"calls": []})
    assert await kept == {"calls": []}
    assert gate.pending == 0  # released on arrival


async def test_a_main_call_that_never_hands_the_ref_over_releases_the_gate() -> None:
    gate = SidecarGate(limit=1)
    router = deployed_router(StreamingMain(None), gate)
    deployment: Any = Router
    start = await deployment.func_or_class._start_sidecar(router, {})
    assert start is not None and start.prediction is not None
    [_ async for _ in deployment.func_or_class._main_events(router, {"ooo_spec": {}},
                                                            start.token)]
    try:
        await start.prediction
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("a prediction came from a call never made")
    assert gate.pending == 0


async def _awaited(prediction: Any, awaiting: asyncio.Event | None = None) -> Any:
    if awaiting is not None:
        awaiting.set()  # the await below starts in this same step
    return await prediction
