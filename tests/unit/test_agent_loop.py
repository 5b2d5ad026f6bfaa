"""Pre-execution, reconciliation and the `execute_tools` loop (app.api.agent_loop, ChatService),
with a scripted main model, a scripted sidecar and an in-process tool pool."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import pytest

from app.api import chat_service
from app.api.agent_loop import SidecarStart, combine_outcomes, sum_main
from app.api.chat_service import ChatService
from app.api.pre_execution import PreExecution, ToolPolicy, ToolRun, speculable_calls
from app.api.prefix_index import ROUTE_KEY, ROUTING_LOG, AffinityDecision
from app.openai_models import ChatCompletionRequest, MainReport
from app.speculation.canonical import Invocation
from app.speculation.prediction import Prediction
from app.speculation.turn import TurnDelta, TurnEvent, TurnResult
from app.tenancy import ANONYMOUS_TENANT
from app.tools.call_context import ToolCallContext
from app.tools.policy import may_pre_execute
from app.tools.registry import ToolOutput, ToolRegistry, ToolResult, ToolSpec
from tests.unit.turns import turn_result

KEY_SCHEMA = {
    "type": "object",
    "properties": {"key": {"type": "string"}, "mode": {"type": "string", "default": "fast"}},
    "required": ["key"],
}
TEXT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

# The tests wait for events (a run dispatched, finished, cancelled); this bound only turns a
# wait that never ends (a broken product) into a failure.
pytestmark = pytest.mark.timeout(60)


class ManualClock:
    """A clock that moves only when a fake says time passed (a tool run, a decode): the times a
    test asserts are the ones its fakes spent, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakePool:
    """The ToolWorker pool in-process: a real registry, the worker's policy check, a log.

    A lookup takes `lookup_s`: on `clock` if given (advanced when it runs), else asleep. With
    `hold`, a speculative run waits for that event before it runs (never set: it is in flight
    until cancelled)."""

    def __init__(self, lookup_s: float = 0.05, clock: ManualClock | None = None,
                 hold: asyncio.Event | None = None) -> None:
        self.lookup_s = lookup_s
        self.clock = clock
        self.hold = hold
        self.calls: list[tuple[str, dict[str, Any], bool]] = []
        self.tenants: list[str] = []  # the tenant each call was run for
        self.cancelled: list[str] = []
        self.notes: list[str] = []
        # Set when the first speculative run reaches the pool: a script's main model can hold
        # its commit until then, so "predicted before the commit" holds however loaded the
        # machine is (the prediction's checks run on a worker thread).
        self.speculated = asyncio.Event()
        # Set once a speculative run has its result (and the router has it, in the same step):
        # a commit held until then finds it finished.
        self.finished = asyncio.Event()
        self.cancelled_run = asyncio.Event()  # set when a run is cancelled
        self.registry = ToolRegistry()
        self.registry.register(
            ToolSpec(name="lookup", parameters=KEY_SCHEMA, idempotent=True, speculate="always",
                     timeout_s=5, source="python"),
            self._lookup,
        )
        self.registry.register(
            ToolSpec(name="note", parameters=TEXT_SCHEMA, idempotent=False, speculate="never",
                     timeout_s=5, source="python"),
            self._note,
        )

    async def _lookup(self, arguments: dict[str, Any]) -> ToolOutput:
        if self.clock is not None:
            self.clock.advance(self.lookup_s)
        else:
            await asyncio.sleep(self.lookup_s)
        return ToolOutput(f"value of {arguments['key']}")

    async def _note(self, arguments: dict[str, Any]) -> ToolOutput:
        self.notes.append(arguments["text"])
        return ToolOutput("saved")

    async def specs(self) -> Mapping[str, ToolSpec]:
        return {spec.name: spec for spec in self.registry.specs()}

    async def execute(self, name: str, arguments: dict[str, Any], speculative: bool,
                      tenant: str = ANONYMOUS_TENANT) -> ToolResult:
        self.calls.append((name, arguments, speculative))
        self.tenants.append(tenant)
        if speculative:
            self.speculated.set()
        if speculative and not may_pre_execute(self.registry.get(name), True, False):
            return ToolResult(name=name, content="refused", is_error=True, latency_ms=0)
        try:
            if speculative and self.hold is not None:
                await self.hold.wait()
            result = await self.registry.execute(name, arguments, ToolCallContext(tenant))
        except asyncio.CancelledError:
            self.cancelled.append(name)
            self.cancelled_run.set()
            raise
        if speculative:
            self.finished.set()
        return result


def final(calls: list[dict[str, Any]], content: str | None = None) -> TurnResult:
    return turn_result(calls, content)


class Script:
    """A main model that commits the scripted finals, one per turn, after `decode_s`, and a
    sidecar whose prediction arrives after `predict_s` (on `clock` if given: the clock moves,
    nothing sleeps, and the prediction is there at once).

    What a turn waits for before it commits, so that the test's ordering holds however loaded
    the machine is: with `commit_after`, the first turn waits for that event (e.g.
    `FakePool.speculated`); with `before_commit`, every turn awaits `before_commit(turn)`.
    With `predict_after`, predictions arrive only once that event is set. `committed` is set
    as each final is handed over, right before the router reads its commit time."""

    def __init__(
        self,
        finals: list[TurnResult],
        predictions: list[list[dict[str, Any]]] | None = None,
        decode_s: float = 0.2,
        predict_s: float = 0.01,
        commit_after: asyncio.Event | None = None,
        *,
        clock: ManualClock | None = None,
        before_commit: Callable[[int], Awaitable[Any]] | None = None,
        predict_after: asyncio.Event | None = None,
    ) -> None:
        self.finals = finals
        self.commit_after = commit_after
        self.before_commit = before_commit
        self.predict_after = predict_after
        self.clock = clock
        self.committed = asyncio.Event()
        self.predicted: list[asyncio.Future[dict[str, Any]]] = []
        self.predictions = predictions or []
        self.decode_s = decode_s
        self.predict_s = predict_s
        self.payloads: list[dict[str, Any]] = []
        self.sidecar_payloads: list[dict[str, Any]] = []

    async def start_sidecar(self, payload: dict[str, Any]) -> SidecarStart:
        turn = len(self.sidecar_payloads)
        self.sidecar_payloads.append(payload)
        calls = self.predictions[turn] if turn < len(self.predictions) else []

        async def predict() -> dict[str, Any]:
            if self.predict_after is not None:
                await self.predict_after.wait()
            elif self.clock is None:
                await asyncio.sleep(self.predict_s)
            return Prediction.model_validate({"candidates": [calls] if calls else []}).model_dump()

        future = asyncio.ensure_future(predict())
        self.predicted.append(future)
        return SidecarStart(token=f"ref-{turn}", prediction=future)

    async def main_events(
        self, payload: dict[str, Any], token: Any
    ) -> AsyncIterator[TurnEvent]:
        turn = len(self.payloads)
        self.payloads.append(payload)
        yield TurnDelta("x")
        if turn == 0 and self.commit_after is not None:
            await self.commit_after.wait()
        if self.before_commit is not None:
            await self.before_commit(turn)
        if self.clock is not None:
            self.clock.advance(self.decode_s)
        else:
            await asyncio.sleep(self.decode_s)
        yield self.finals[turn]
        # The router asks for the next event, finds none and reads its commit time at once.
        self.committed.set()


class Watched:
    """The pre-executions the chat service made (`PreExecution`, recorded by the `watched`
    fixture): a test can wait until every prediction so far has been handled."""

    def __init__(self) -> None:
        self.made: list[PreExecution] = []
        self.settling = asyncio.Event()  # set as a turn's calls are reconciled

    async def handled(self, turn: int = 0) -> None:
        """Every watcher so far has ended: each prediction's allowed calls are dispatched, the
        rest refused (or the watch was stopped)."""
        watchers = {p._watcher for p in self.made if p._watcher is not None}
        if watchers:
            await asyncio.wait(watchers)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Watched:
    record = Watched()

    class Recorded(PreExecution):
        def watch(self, prediction: Awaitable[Any]) -> None:
            record.made.append(self)
            super().watch(prediction)

        async def settle(self, committed: Iterable[Invocation],
                         wait: bool) -> list[ToolRun | None]:
            record.settling.set()
            return await super().settle(committed, wait)

    monkeypatch.setattr(chat_service, "PreExecution", Recorded)
    return record


def request(
    *,
    execute_tools: bool = False,
    max_steps: int = 4,
    tool_choice: Any = "required",
    enabled: bool = True,
    server_tools: bool | list[str] = True,
) -> ChatCompletionRequest:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": s}}
        for n, s in (("lookup", KEY_SCHEMA), ("note", TEXT_SCHEMA), ("get_weather", TEXT_SCHEMA))
    ]
    return ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "go"}],
            "tools": tools,
            "tool_choice": tool_choice,
            "ooo_spec": {"enabled": enabled, "execute_tools": execute_tools,
                         "max_steps": max_steps, "server_tools": server_tools},
        }
    )


async def complete(
    service: ChatService, req: ChatCompletionRequest, script: Script
) -> dict[str, Any]:
    result: dict[str, Any] | None = None
    async for kind, event in service.events(req, script.start_sidecar, script.main_events):
        if kind == "final":
            result = event
    assert result is not None
    return result


def lookup(key: str, **extra: Any) -> dict[str, Any]:
    return {"name": "lookup", "arguments": {"key": key, **extra}}


async def test_hit_without_execute_tools_reports_the_finished_result() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.05, clock=clock)
    # The commit waits for the run's result: "finished before the commit" by construction.
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], decode_s=0.2,
                    commit_after=pool.finished, clock=clock)
    out = await complete(ChatService("m", True, pool, clock=clock), request(), script)
    call = out["choices"][0]["message"]["tool_calls"][0]
    [result] = out["ooo_spec"]["tool_results"]
    assert result["tool_call_id"] == call["id"]
    assert result["speculative"] is True and result["content"] == "value of a"
    # Finished before the commit: the whole latency overlapped decoding.
    assert result["latency_ms"] == pytest.approx(50)
    assert result["saved_ms"] == pytest.approx(result["latency_ms"])
    assert pool.calls == [("lookup", {"key": "a"}, True)]
    assert out["ooo_spec"]["timings_ms"]["tools"] == 0.0


async def test_without_execute_tools_a_run_still_in_flight_is_not_awaited() -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock, hold=asyncio.Event())  # the run never ends on its own
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], decode_s=0.05,
                    commit_after=pool.speculated, clock=clock)
    # Were the run awaited, the request would hang: the bound makes that a failure.
    out = await asyncio.wait_for(complete(ChatService("m", True, pool, clock=clock), request(),
                                          script), 30)
    # Dispatched before the commit, still running at it: neither awaited nor reported.
    assert pool.calls == [("lookup", {"key": "a"}, True)]
    assert out["ooo_spec"]["tool_results"] == []
    await asyncio.wait_for(pool.cancelled_run.wait(), 30)
    assert pool.cancelled == ["lookup"]


async def test_canonical_hit_with_defaults_and_in_flight_wait_under_execute_tools() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.3, clock=clock)
    # Committed with the schema default written out: canonically the same call.
    script = Script(
        [final([lookup("a", mode="fast")]), final([], content="done")],
        predictions=[[lookup("a")]],
        decode_s=0.1,
        commit_after=pool.speculated,
        clock=clock,
    )
    pool.hold = script.committed  # the run goes on until the commit, then takes its 0.3 s
    out = await complete(ChatService("m", True, pool, clock=clock), request(execute_tools=True),
                         script)
    [result] = out["ooo_spec"]["tool_results"]
    assert result["speculative"] is True
    # Dispatched, 0.1 s of decoding to the commit, then the run's 0.3 s: the overlap ends at
    # the commit, not at the finish.
    assert result["latency_ms"] == pytest.approx(400)
    assert result["saved_ms"] == pytest.approx(100)
    assert [c[2] for c in pool.calls] == [True]  # never run twice
    assert out["ooo_spec"]["timings_ms"]["tools"] > 0
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "done"}


async def test_miss_is_cancelled_and_the_committed_call_runs_after_the_commit() -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock, hold=asyncio.Event())  # the miss is in flight until cancelled
    script = Script(
        [final([lookup("b")]), final([], content="ok")],
        predictions=[[lookup("a")]],
        decode_s=0.05,
        commit_after=pool.speculated,
        clock=clock,
    )
    out = await complete(ChatService("m", True, pool, clock=clock), request(execute_tools=True),
                         script)
    [result] = out["ooo_spec"]["tool_results"]
    assert (result["content"], result["speculative"], result["saved_ms"]) == (
        "value of b", False, 0.0)
    assert pool.calls == [("lookup", {"key": "a"}, True), ("lookup", {"key": "b"}, False)]
    await asyncio.wait_for(pool.cancelled_run.wait(), 30)
    assert pool.cancelled == ["lookup"]


async def test_every_tool_run_is_for_the_callers_tenant() -> None:
    """Pre-executed and committed calls alike carry the caller's tenant to the pool, which runs
    the tool in that tenant's context (per-tenant tool state: app/tools/call_context.py)."""
    clock = ManualClock()
    pool = FakePool(clock=clock)
    script = Script(
        [final([lookup("b")]), final([], content="ok")],
        predictions=[[lookup("a")]],
        decode_s=0.05,
        commit_after=pool.speculated,
        clock=clock,
    )
    events = ChatService("m", True, pool, clock=clock).events(
        request(execute_tools=True), script.start_sidecar, script.main_events, tenant="key-a")
    async for _ in events:
        pass
    assert [c[2] for c in pool.calls] == [True, False]  # one speculative, one committed
    assert pool.tenants == ["key-a", "key-a"]


async def test_non_idempotent_tool_is_never_pre_executed(watched: Watched) -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock)
    note = {"name": "note", "arguments": {"text": "hi"}}
    # Each commit waits until its prediction was handled: refused, not merely late.
    script = Script([final([note]), final([], content="ok")], predictions=[[note]], clock=clock,
                    before_commit=watched.handled)
    out = await complete(ChatService("m", True, pool, clock=clock), request(execute_tools=True),
                         script)
    assert pool.calls == [("note", {"text": "hi"}, False)]
    assert pool.notes == ["hi"]
    [result] = out["ooo_spec"]["tool_results"]
    assert result["speculative"] is False


async def test_pre_execution_switched_off_by_policy(watched: Watched) -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock)
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], clock=clock,
                    before_commit=watched.handled)
    service = ChatService("m", True, pool, ToolPolicy(pre_execute=False), clock=clock)
    out = await complete(service, request(), script)
    assert len(watched.made) == 1  # the prediction was there, and handled before the commit
    assert pool.calls == [] and out["ooo_spec"]["tool_results"] == []


async def test_loop_runs_max_steps_rounds_then_a_final_text_turn(watched: Watched) -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)
    # Each turn commits once its prediction's run was dispatched.
    script = Script(
        [final([lookup("a")]), final([lookup("b")]), final([], content="the answer")],
        predictions=[[lookup("a")], [lookup("b")]],
        clock=clock,
        before_commit=watched.handled,
    )
    named = {"type": "function", "function": {"name": "lookup"}}
    req = request(execute_tools=True, max_steps=2, tool_choice=named)
    out = await complete(ChatService("m", True, pool, clock=clock), req, script)
    message = out["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "the answer"}
    assert out["choices"][0]["finish_reason"] == "stop"
    results = out["ooo_spec"]["tool_results"]
    assert [r["content"] for r in results] == ["value of a", "value of b"]
    assert all(r["speculative"] for r in results)
    # Each turn is fanned out anew; the last one must answer, so it is not speculated.
    assert len(script.payloads) == 3 and len(script.sidecar_payloads) == 2
    assert [p.get("tool_choice") for p in script.payloads] == [named, named, "none"]
    second = script.payloads[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert second[1]["tool_calls"][0]["id"] == second[2]["tool_call_id"] == results[0][
        "tool_call_id"]
    assert json.loads(second[1]["tool_calls"][0]["function"]["arguments"]) == {"key": "a"}
    assert second[2]["content"] == "value of a"
    third = script.payloads[2]["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "tool", "assistant", "tool"]
    main = out["ooo_spec"]["main"]
    assert (main["steps"], main["completion_tokens"], main["ttft_ms"]) == (9, 15, 7.0)
    assert out["usage"] == {"prompt_tokens": 30, "completion_tokens": 15, "total_tokens": 45,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    assert out["ooo_spec"]["timings_ms"]["main"] == 90.0


async def test_unknown_tool_ends_the_loop_and_goes_back_to_the_client() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)
    weather = {"name": "get_weather", "arguments": {"text": "Paris"}}
    script = Script([final([lookup("a"), weather])], predictions=[[lookup("a")]],
                    commit_after=pool.finished, clock=clock)
    out = await complete(ChatService("m", True, pool, clock=clock), request(execute_tools=True),
                         script)
    message = out["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["lookup", "get_weather"]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    # Nothing ran after the commit; the finished pre-execution is reported for the client.
    [result] = out["ooo_spec"]["tool_results"]
    assert result["tool_call_id"] == message["tool_calls"][0]["id"]
    assert [c[2] for c in pool.calls] == [True]
    assert len(script.payloads) == 1


async def test_parallel_identical_calls_use_one_pre_execution_each() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)
    script = Script([final([lookup("a"), lookup("a")]), final([], content="ok")],
                    predictions=[[lookup("a")]], commit_after=pool.speculated, clock=clock)
    out = await complete(ChatService("m", True, pool, clock=clock), request(execute_tools=True),
                         script)
    assert [r["speculative"] for r in out["ooo_spec"]["tool_results"]] == [True, False]
    assert [c[2] for c in pool.calls] == [True, False]


async def test_disabled_speculation_still_runs_the_loop() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)
    script = Script([final([lookup("a")]), final([], content="ok")], clock=clock)
    out = await complete(ChatService("m", True, pool, clock=clock),
                         request(execute_tools=True, enabled=False), script)
    assert script.sidecar_payloads == []
    assert out["ooo_spec"]["outcome"] == "disabled"
    [result] = out["ooo_spec"]["tool_results"]
    assert result["speculative"] is False


async def test_prediction_after_the_commit_starts_nothing(watched: Watched) -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock)
    # The prediction arrives only once the committed calls are being reconciled.
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], clock=clock,
                    predict_after=watched.settling)
    out = await complete(ChatService("m", True, pool, clock=clock), request(), script)
    # The watch is over (it had the prediction, or was stopped): nothing more can start.
    await asyncio.wait_for(watched.handled(), 30)
    assert [p.dispatched for p in watched.made] == [0]
    assert pool.calls == [] and out["ooo_spec"]["tool_results"] == []


def test_speculable_calls_filters_invalid_unknown_and_unforced() -> None:
    specs = {"lookup": ToolSpec(name="lookup", parameters=KEY_SCHEMA, idempotent=True,
                                speculate="always", timeout_s=1, source="python")}
    schemas = {"lookup": KEY_SCHEMA, "other": TEXT_SCHEMA}
    prediction = Prediction.model_validate({"candidates": [
        [lookup("a"), {"name": "lookup", "arguments": {"key": 3}}],
        [{"name": "other", "arguments": {"text": "t"}}, {"name": "nope", "arguments": {}}],
    ]})
    assert speculable_calls(prediction, schemas, specs, None) == [
        Invocation(name="lookup", arguments={"key": "a"})]
    assert speculable_calls(prediction, schemas, specs, "other") == []
    failed = Prediction(error="boom", candidates=prediction.candidates)
    assert speculable_calls(failed, schemas, specs, None) == []


async def test_failed_prediction_means_no_pre_execution() -> None:
    pool = FakePool()
    pre = PreExecution(pool, ToolPolicy(), {"lookup": KEY_SCHEMA})
    broken: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    broken.set_exception(RuntimeError("sidecar died"))
    pre.watch(broken)
    assert pre._watcher is not None
    await asyncio.wait({pre._watcher})  # the watch saw the failure and ended
    assert await pre.settle([Invocation(name="lookup", arguments={"key": "a"})], wait=True) == [
        None]
    assert pool.calls == []


def test_combine_outcomes() -> None:
    assert combine_outcomes(["hit", "hit", "disabled"]) == "hit"
    assert combine_outcomes(["hit", "miss"]) == "partial"
    assert combine_outcomes(["miss", "sidecar_late"]) == "miss"
    assert combine_outcomes(["disabled"]) == "disabled"


def test_sum_main() -> None:
    a = MainReport(steps=2, completion_tokens=4, drafted_tokens=1, accepted_tokens=1,
                   ttft_ms=5.0, decode_ms=10.0, cached_tokens=3)
    b = a.model_copy(update={"ttft_ms": 99.0})
    total = sum_main([a, b])
    assert (total.steps, total.completion_tokens, total.ttft_ms, total.decode_ms,
            total.cached_tokens) == (4, 8, 5.0, 20.0, 6)


class RoutedScript(Script):
    """The main model behind a cache-affinity request router: as Serve's router does in the
    Router's process, each turn's decision is left in `ROUTING_LOG` under the payload's route
    id (for the main call, and the sidecar's under its own target), before the turn runs;
    `decisions[turn]` None: Serve's own router chose."""

    def __init__(self, finals: list[TurnResult],
                 decisions: list[AffinityDecision | None], **kwargs: Any) -> None:
        super().__init__(finals, **kwargs)
        self.decisions = decisions

    async def main_events(
        self, payload: dict[str, Any], token: Any
    ) -> AsyncIterator[TurnEvent]:
        decision = self.decisions[len(self.payloads)]
        if decision is not None:
            ROUTING_LOG.record(payload[ROUTE_KEY], "MainModel", decision)
            ROUTING_LOG.record(payload[ROUTE_KEY], "Sidecar", decision)
        async for event in super().main_events(payload, token):
            yield event


async def test_each_main_call_reports_its_replica_cached_tokens_and_routing() -> None:
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)

    def served(calls: list[dict[str, Any]], replica: str, cached: int) -> TurnResult:
        turn = final(calls)
        return dataclasses.replace(turn, replica=replica, main=turn.main.model_copy(
            update={"cached_tokens": cached}))

    script = RoutedScript(
        [served([lookup("a")], "r1", 0), served([], "r2", 12)],
        [AffinityDecision(None, 0, "no_match"), AffinityDecision("r2", 480, "affinity")],
        clock=clock,
    )
    named = {"type": "function", "function": {"name": "lookup"}}
    req = request(execute_tools=True, max_steps=1, tool_choice=named)
    before = len(ROUTING_LOG)
    out = await complete(ChatService("m", True, pool, clock=clock), req, script)
    # Every turn's call is named by its own route id, and none reaches the model's request.
    routes = [p[ROUTE_KEY] for p in script.payloads]
    assert len(set(routes)) == 2
    assert out["ooo_spec"]["routing"] == [
        {"replica": "r1", "prompt_tokens": 10, "cached_tokens": 0, "decision": "no_match",
         "matched_chars": 0},
        {"replica": "r2", "prompt_tokens": 10, "cached_tokens": 12, "decision": "affinity",
         "matched_chars": 480},
    ]
    assert out["ooo_spec"]["main"]["cached_tokens"] == 12
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 12}
    assert len(ROUTING_LOG) == before  # taken, the sidecar's too: nothing left behind


async def test_without_an_affinity_router_the_routing_report_has_no_decision() -> None:
    script = RoutedScript([final([])], [None], clock=ManualClock())
    out = await complete(ChatService("m", True, FakePool()), request(), script)
    assert out["ooo_spec"]["routing"] == [
        {"replica": None, "prompt_tokens": 10, "cached_tokens": 0, "decision": None,
         "matched_chars": 0}]


async def test_a_dropped_request_cancels_its_pre_executions() -> None:
    clock = ManualClock()
    pool = FakePool(clock=clock, hold=asyncio.Event())  # the run never ends on its own
    # Nor does the main model's decoding: the client drops the request first.
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]],
                    commit_after=asyncio.Event(), clock=clock)
    consumer = asyncio.ensure_future(complete(ChatService("m", True, pool, clock=clock),
                                              request(), script))
    await pool.speculated.wait()  # the prediction is in and the run dispatched
    assert pool.calls == [("lookup", {"key": "a"}, True)]
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    await asyncio.wait_for(pool.cancelled_run.wait(), 30)
    assert pool.cancelled == ["lookup"]


@pytest.mark.parametrize("declared", [False, ["get_weather"]], ids=["none", "other-tool"])
async def test_a_client_tool_sharing_a_server_tools_name_is_not_run_without_opt_in(
    declared: bool | list[str], watched: Watched,
) -> None:
    """`lookup` is registered on the server, but the request did not declare it the server's:
    neither pre-executed nor run; the committed call goes back to the client."""
    clock = ManualClock()
    pool = FakePool(clock=clock)
    script = Script([final([lookup("a")]), final([], content="done")],
                    predictions=[[lookup("a")]], clock=clock, before_commit=watched.handled)
    out = await complete(ChatService("m", True, pool, clock=clock),
                         request(execute_tools=True, server_tools=declared), script)
    assert len(watched.made) == 1  # the prediction was handled before the commit
    assert pool.calls == []
    assert out["ooo_spec"]["tool_results"] == []
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


def test_server_tools_must_name_offered_tools() -> None:
    with pytest.raises(ValueError, match="server_tools"):
        request(server_tools=["nope"])
    assert request(server_tools=True).server_tool_names == {"lookup", "note", "get_weather"}
    assert request(server_tools=False).server_tool_names == set()


@pytest.mark.parametrize("error, said", [
    (TimeoutError("the tool worker did not answer within 7 s"), "did not answer in time"),
    (RuntimeError("secret internal detail"), "could not run"),
])
async def test_a_lost_tool_call_says_what_happened_without_internals(
    error: Exception, said: str
) -> None:
    from app.api.pre_execution import run_tool

    class Failing:
        async def execute(self, name: str, arguments: dict[str, Any],
                          speculative: bool, tenant: str) -> ToolResult:
            raise error

    run = await run_tool(Failing(), Invocation(name="lookup", arguments={}), False,  # type: ignore[arg-type]
                         lambda: 0.0)
    assert run.result is not None and run.result.is_error
    assert run.result.content == f"tool 'lookup' {said}"


class GreedyScript(Script):
    """A main model that calls `lookup` every turn and writes all the tokens its turn may
    (the payload's `max_tokens`, else `per_turn`), as the live run in issue 39 did."""

    def __init__(self, per_turn: int, clock: ManualClock) -> None:
        super().__init__([], clock=clock, decode_s=0.01)
        self.per_turn = per_turn

    async def main_events(
        self, payload: dict[str, Any], token: Any
    ) -> AsyncIterator[TurnEvent]:
        self.payloads.append(payload)
        allowed = min(payload.get("max_tokens", self.per_turn), self.per_turn)
        calls = [lookup(f"k{len(self.payloads)}")] if payload.get("tool_choice") != "none" else []
        yield dataclasses.replace(turn_result(calls, None if calls else "done"),
                                  completion_tokens=allowed)


@pytest.mark.parametrize(("budget", "per_turn", "turns"), [(48, 20, 3), (48, 48, 1), (40, 20, 2)])
async def test_the_loops_turns_share_one_token_budget(budget: int, per_turn: int,
                                                      turns: int) -> None:
    """`execute_tools` keeps `tool_choice: required` for up to `max_steps` turns; each turn's
    tokens count against the request's one budget (what the checks counted against
    `limits.max_request_tokens`): the next turn gets what is left, and once nothing is left
    the calls go back to the client unexecuted. Usage, summed over the turns, stays within."""
    clock = ManualClock()
    pool = FakePool(lookup_s=0.01, clock=clock)
    script = GreedyScript(per_turn, clock)
    req = request(execute_tools=True, max_steps=16)
    result: dict[str, Any] | None = None
    async for kind, event in ChatService("m", False, pool, clock=clock).events(
            req, script.start_sidecar, script.main_events, token_budget=budget):
        if kind == "final":
            result = event
    assert result is not None
    assert result["usage"]["completion_tokens"] == budget
    assert len(script.payloads) == turns
    # Each later turn was asked for at most what the turns before it left.
    spent = 0
    for index, payload in enumerate(script.payloads):
        if index:
            assert payload["max_tokens"] == budget - spent
        spent += min(payload.get("max_tokens", per_turn), per_turn)
    # The budget ran out on a turn with a call: it goes back to the client, not run.
    message = result["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "lookup"
    assert len(pool.calls) == turns - 1


async def test_without_a_budget_the_loop_runs_to_max_steps() -> None:
    clock = ManualClock()
    script = GreedyScript(20, clock)
    out = await complete(ChatService("m", False, FakePool(lookup_s=0.01, clock=clock),
                                     clock=clock),
                         request(execute_tools=True, max_steps=2), script)
    assert len(script.payloads) == 3  # two tool rounds, then the text answer
    assert out["usage"]["completion_tokens"] == 60


async def test_no_later_turn_of_the_loop_starts_more_engine_requests_than_were_admitted() -> None:
    """The key's slot is sized once, from the request (`work_of`); every later turn of the loop
    asks for no more engine requests at once (the same tools and mode, or `tool_choice:
    none`), so the slot covers each turn."""
    from app.api.work import WorkPlan, sidecar_requests

    clock = ManualClock()
    script = GreedyScript(10, clock)
    req = request(execute_tools=True, max_steps=3)
    await complete(ChatService("m", False, FakePool(lookup_s=0.01, clock=clock), clock=clock),
                   req, script)
    plan = WorkPlan(slots_mode=True, max_slots=32)
    admitted = sidecar_requests(req, plan)
    assert admitted >= 2 and len(script.payloads) == 4
    for payload in script.payloads:
        turn = ChatCompletionRequest.model_validate(
            {k: v for k, v in payload.items() if not k.startswith("_")})
        assert sidecar_requests(turn, plan) <= admitted
