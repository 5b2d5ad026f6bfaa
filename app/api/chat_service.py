"""Router-side logic of one chat completion, independent of Ray.

The deployment supplies two callables — `start_sidecar(payload)` (a `SidecarStart`: the token
the main call carries plus the prediction for pre-execution, or None) and
`main_events(payload, token)` (the main model's event stream) — and a `ToolAccess` for the tool
pool. The turn loop, the OpenAI response and SSE shapes and the `ooo_spec` report live here,
testable without a model; request checks are in request_checks.py, pre-execution in
pre_execution.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

from app import telemetry
from app.api.agent_loop import LoopState, SidecarStart, combine_outcomes, sum_main
from app.api.errors import ApiError, api_error
from app.api.pre_execution import Clock, PreExecution, ToolAccess, ToolPolicy, ToolRun, run_tool
from app.api.prefix_index import ROUTE_KEY, ROUTING_LOG, AffinityDecision
from app.api.sidecar_value import SidecarValue, value_key
from app.api.streaming import (  # noqa: F401 - moved there; importers of this module keep them
    _choice_chunks,
    _merged,
    chunk,
    merged_usage,
    sse,
    stream_sse,
)
from app.config import SidecarValueConfig, TelemetryConfig
from app.formats.tool_format import new_call_id
from app.openai_models import (
    ChatCompletionRequest,
    OooSpecReport,
    PredictionReport,
    RouteReport,
    SidecarDecision,
    TimingsReport,
)
from app.speculation.canonical import Invocation
from app.speculation.prediction import Prediction
from app.speculation.reconcile import Outcome, classify_outcome
from app.speculation.turn import TurnDelta, TurnError, TurnEvent, TurnResult
from app.telemetry import HitRateWindow, MetricsSink, NullMetrics
from app.tenancy import ANONYMOUS_TENANT, TENANT_KEY

logger = logging.getLogger(__name__)

StartSidecar = Callable[[dict[str, Any]], Awaitable[SidecarStart | None]]
# The main replica's events for one turn; raises `TurnError` when the request cannot be served.
MainEvents = Callable[[dict[str, Any], Any], AsyncIterator[TurnEvent]]


@dataclass
class _Turn:
    """One main-model turn after its commit."""

    final: TurnResult
    call_ids: list[str]
    commit: float
    pre: PreExecution | None
    # The sidecar's prediction as the router saw it (`await_prediction` only).
    prediction: PredictionReport | None = None
    # Whether the turn called the sidecar and why; None: the request did not want it.
    decision: SidecarDecision | None = None
    # Where the main call ran (its replica, the prefix cache, the affinity decision).
    route: RouteReport = field(default_factory=RouteReport)

    @property
    def invocations(self) -> list[Invocation]:
        return self.final.calls


class ChatService:
    """One chat completion: the sidecar and main fan-out, pre-execution of server-known tools,
    and — with `ooo_spec.execute_tools` — the agent loop.

    The loop (`execute_tools: true`): each turn fans out to sidecar and main model anew (so
    every turn is speculated and pre-executed again). When every call the main model commits
    names a server-known tool (registered on the server, offered in `tools` and declared the
    server's in `ooo_spec.server_tools`), the server runs
    them (reusing pre-executed results on canonical hits), appends the assistant message and
    the tool messages, and starts the next turn. `max_steps` bounds these tool rounds; after the
    last one, one more turn runs with `tool_choice: "none"` so the response always ends in a
    final assistant message (LangChain's `early_stopping_method="generate"`). A turn that
    commits any call the server does not know ends the loop: its calls go back to the client
    as ordinary `tool_calls`, unexecuted, and are treated as with `execute_tools: false`.
    The turns share the request's one token budget (`max_tokens`, or the server's ceiling:
    what the request checks counted against `limits.max_request_tokens`): each next turn may
    generate what the turns before left, and once nothing is left the committed calls go back
    to the client unexecuted, so the usage summed over the turns stays within it.

    With `execute_tools: false` nothing runs after the commit; `tool_results` lists only
    pre-executed results that match a committed call and were finished when it was committed
    (same `tool_call_id` as in `tool_calls`), so pre-execution never makes a response slower.
    Anything else pre-executed is cancelled at the commit.
    """

    def __init__(
        self,
        model_name: str,
        sidecar_enabled: bool,
        tools: ToolAccess | None = None,
        policy: ToolPolicy | None = None,
        clock: Clock = time.perf_counter,
        baselines: Collection[str] = (),
        metrics: MetricsSink | None = None,
        telemetry_config: TelemetryConfig | None = None,
        sidecar_value: SidecarValueConfig | None = None,
    ) -> None:
        settings = telemetry_config or TelemetryConfig()
        # Skips the sidecar where it has not paid lately (app/api/sidecar_value.py).
        self.sidecar_value = SidecarValue(sidecar_value or SidecarValueConfig())
        self.metrics: MetricsSink = metrics or NullMetrics()
        self.record_content = settings.record_content
        self.hit_rate = HitRateWindow(settings.hit_rate_window)
        self.model_name = model_name
        self.sidecar_enabled = sidecar_enabled
        self.baselines = frozenset(baselines)  # comparison engines deployed (e.g. 'ngram')
        self.tools = tools
        self.policy = policy or ToolPolicy()
        self.clock = clock

    def check_options(self, request: ChatCompletionRequest) -> None:
        """Reject what this deployment cannot serve before anything starts."""
        baseline = request.ooo_spec.baseline
        if baseline is not None and baseline not in self.baselines:
            deployed = ", ".join(sorted(self.baselines)) or "none"
            raise ApiError(
                400,
                f"baseline '{baseline}' is not deployed on this server (deployed: {deployed}); "
                f"enable it with `baselines.{baseline}.enabled: true` in the app config",
                param="ooo_spec.baseline",
                code="baseline_not_deployed",
            )

    def wants_sidecar(self, request: ChatCompletionRequest) -> bool:
        return (
            self.sidecar_enabled
            and request.ooo_spec.enabled
            and request.ooo_spec.sidecar
            and request.ooo_spec.baseline is None
            and request.effective_tool_choice != "none"
            # Nothing would draft its prediction (`ooo_spec.no_drafts_reason`).
            and request.draft_free_reason() is None
        )

    def sidecar_decision(self, request: ChatCompletionRequest, tenant: str) -> SidecarDecision:
        """Whether a turn that wants the sidecar calls it (app/api/sidecar_value.py)."""
        if request.ooo_spec.diagnostics.await_prediction:
            return SidecarDecision(call=True, reason="diagnostics")
        if (self.tools is not None and request.ooo_spec.pre_execute
                and request.server_tool_names):
            return SidecarDecision(call=True, reason="pre_execution")
        return self.sidecar_value.decide(value_key(tenant, request.tool_schemas()))

    def _observe_sidecar(self, request: ChatCompletionRequest, tenant: str,
                         final: TurnResult) -> None:
        """The called sidecar's gain on this turn; nothing when it never answered (an error
        says nothing of what its predictions are worth)."""
        if final.sidecar.status in ("received", "late"):
            self.sidecar_value.observe(value_key(tenant, request.tool_schemas()),
                                       final.main.sources.sidecar.gain_tokens, final.main.steps)

    async def events(
        self,
        request: ChatCompletionRequest,
        start_sidecar: StartSidecar,
        main_events: MainEvents,
        trace_parent: Context | None = None,
        tenant: str = ANONYMOUS_TENANT,
        token_budget: int | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """('delta', {'text'}) per main-model step, then ('final', completion dict).
        `tenant`: the caller's (app.api.auth), carried to the main replica and the sidecar.
        `token_budget`: the most tokens the request may generate over all its turns (what the
        request checks counted for it, app/api/work.py; None: no bound beyond each turn's).

        The request is one trace of its own: `router.request` (linked to `trace_parent`, the
        client's `traceparent`, if any; never its child) with an `agent.turn` span per turn.
        Its metrics are recorded when the final completion is ready, or as outcome `error`
        when it fails."""
        state = LoopState()
        root = telemetry.start_root_span("router.request", trace_parent, kind=SpanKind.SERVER)
        completed = False
        try:
            async for kind, event in self._events(request, start_sidecar, main_events, state,
                                                  root, tenant, token_budget):
                if kind == "final":
                    completed = True
                    self._observe(root, event, state)
                yield kind, event
        except BaseException as exc:
            telemetry.fail(root, exc)
            if not completed:
                telemetry.record_all(self.metrics, telemetry.failed_request_measurements())
            raise
        finally:
            root.end()

    def _observe(self, root: Span, completion: dict[str, Any], state: LoopState) -> None:
        report = OooSpecReport.model_validate(completion["ooo_spec"])
        telemetry.set_attributes(root, telemetry.request_attributes(report, len(state.finals)))
        telemetry.record_all(self.metrics, telemetry.request_measurements(
            report, state.pre_executed, state.pre_used, self.hit_rate.add(report.outcome)))

    async def _events(
        self,
        request: ChatCompletionRequest,
        start_sidecar: StartSidecar,
        main_events: MainEvents,
        state: LoopState,
        root: Span,
        tenant: str,
        token_budget: int | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        started = self.clock()
        turn_request = request
        while True:
            turn: _Turn | None = None
            messages: list[dict[str, Any]] | None = None
            # Not current (this generator yields): `_turn` hands it on explicitly.
            turn_span = telemetry.start_span(
                "agent.turn", telemetry.context_of(root), {"ooo_spec.turn": len(state.finals)}
            )
            try:
                async for kind, event in self._turn(turn_request, start_sidecar, main_events,
                                                    turn_span, tenant):
                    if kind == "delta":
                        yield kind, event
                    else:
                        turn = event["turn"]
                assert turn is not None
                if state.first_commit is None:
                    state.first_commit = turn.commit
                state.finals.append(turn.final)
                state.routes.append(turn.route)
                if turn.prediction is not None:
                    state.predictions.append(turn.prediction)
                if turn.decision is not None:
                    state.sidecar_decisions.append(turn.decision)
                # Canonical equality validates against the client's schemas: off the loop.
                state.outcomes.append(await asyncio.to_thread(
                    self.outcome, turn_request, turn.final, turn.decision))
                telemetry.set_attributes(turn_span, telemetry.turn_attributes(
                    len(state.finals) - 1, turn_request.effective_tool_choice,
                    state.outcomes[-1], (c.name for c in turn.invocations)))
                try:
                    # No `yield` in here: reconcile and tool spans are children of the turn.
                    with telemetry.within(turn_span):
                        if await self._executes(request, turn, state,
                                                tokens_left(token_budget, state)):
                            messages = await self._run_round(turn, state, tenant)
                        else:
                            await self._report_ready(turn, state)
                finally:
                    # Whatever happened (a dropped client, the deadline), no run outlives its
                    # turn.
                    if turn.pre is not None:
                        turn.pre.cancel()
            except BaseException as exc:
                telemetry.fail(turn_span, exc)
                raise
            finally:
                turn_span.end()
            if messages is None:
                yield "final", self.completion(request, turn, state, started)
                return
            state.rounds += 1
            turn_request = self._next_request(request, turn_request, messages, state,
                                              tokens_left(token_budget, state))

    async def _turn(
        self,
        request: ChatCompletionRequest,
        start_sidecar: StartSidecar,
        main_events: MainEvents,
        span: Span,
        tenant: str = ANONYMOUS_TENANT,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Fan out one turn: the sidecar first, the main call right after without waiting for
        the sidecar's answer; the prediction feeds pre-execution in the background.

        `span` (the turn's) is the parent of the sidecar's and main model's spans, through the
        carrier in the payload, and of pre-executions, through the watcher task's context."""
        payload = request.model_dump(exclude_none=True)
        payload[TENANT_KEY] = tenant
        route_id = payload[ROUTE_KEY] = uuid.uuid4().hex
        carrier = telemetry.inject(telemetry.context_of(span))
        if carrier:
            payload[telemetry.CARRIER_KEY] = carrier
        # The decision is a few dictionary lookups (no I/O); a skipped turn calls nothing
        # more than a `drafts` turn (`ooo_spec.sidecar: false`) before its main call.
        decision = (self.sidecar_decision(request, tenant) if self.wants_sidecar(request)
                    else None)
        sidecar = (await start_sidecar(payload) if decision is not None and decision.call
                   else None)
        if sidecar is not None and sidecar.token is None:
            # The deployment's gate refused the call: the main call goes as a `drafts` one.
            assert decision is not None
            decision = decision.model_copy(update={"call": False, "reason": "busy"})
            sidecar = None
        pre: PreExecution | None = None
        if (
            sidecar is not None
            and sidecar.prediction is not None
            and self.tools is not None
            and request.ooo_spec.pre_execute
        ):
            # Only the tools the request declared the server's: a client's own tool that shares
            # a server tool's name is never run here.
            schemas = request.tool_schemas(request.server_tool_names)
            pre = PreExecution(self.tools, self.policy, schemas, request.named_tool, self.clock,
                               tenant)
            with telemetry.within(span):
                pre.watch(sidecar.prediction)
        observed: asyncio.Future[PredictionReport] | None = None
        if sidecar is not None and sidecar.prediction is not None and (
            request.ooo_spec.diagnostics.await_prediction
        ):
            observed = asyncio.ensure_future(observe_prediction(sidecar.prediction, self.clock))
        final: TurnResult | None = None
        try:
            try:
                async for event in main_events(payload, sidecar.token if sidecar else None):
                    if isinstance(event, TurnDelta):
                        yield "delta", {"text": event.text, "logprobs": event.logprobs}
                    else:
                        final = event
            except TurnError as err:
                raise api_error(err) from None
        except BaseException:
            if pre is not None:
                pre.cancel()
            if observed is not None:
                observed.cancel()
            if sidecar is not None and sidecar.cancel is not None:
                sidecar.cancel()  # a dropped client or the deadline: stop the sidecar too
            raise
        commit = self.clock()
        prediction: PredictionReport | None = None
        try:
            if observed is not None and final is not None:
                prediction = await observed
        finally:
            # The prediction is moot once the main call is over: free the sidecar.
            if sidecar is not None and sidecar.cancel is not None:
                sidecar.cancel()
        if final is None:
            if pre is not None:
                pre.cancel()
            raise ApiError(503, "the main model ended the request without a result")
        if sidecar is not None:
            self._observe_sidecar(request, tenant, final)
        call_ids = [new_call_id() for _ in final.calls]
        route = route_report(final, ROUTING_LOG.take(route_id, "MainModel"))
        ROUTING_LOG.take(route_id, "Sidecar")  # not reported: the sidecar's cache is its own
        yield "turn", {"turn": _Turn(final, call_ids, commit, pre, prediction, decision, route)}

    async def _executes(
        self, request: ChatCompletionRequest, turn: _Turn, state: LoopState,
        left: int | None = None,
    ) -> bool:
        """Whether the server runs this turn's calls (see the class docstring). Not once the
        request's token budget is spent (`left`, see `tokens_left`): no next turn could
        answer, so the calls go back to the client."""
        if not (request.ooo_spec.execute_tools and turn.invocations and self.tools is not None):
            return False
        if state.rounds >= request.ooo_spec.max_steps:
            return False
        if left is not None and left < 1:
            return False
        offered = request.server_tool_names  # declared the server's (ooo_spec.server_tools)
        try:
            known = await self.tools.specs()
        except Exception as exc:
            raise ApiError(503, f"the tool workers are unavailable: {type(exc).__name__}",
                           code="tools_unavailable") from None
        return all(c.name in offered and c.name in known for c in turn.invocations)

    async def _run_round(
        self, turn: _Turn, state: LoopState, tenant: str
    ) -> list[dict[str, Any]]:
        """Execute the committed calls (pre-executed hits first, the rest concurrently), report
        them, and return the assistant + tool messages for the next turn."""
        assert self.tools is not None
        tools = self.tools
        with telemetry.span("reconcile") as span:
            hits = (await turn.pre.settle(turn.invocations, wait=True) if turn.pre is not None
                    else [None] * len(turn.invocations))
            self._reconciled(span, turn, state, hits)
        with telemetry.span("agent.tools") as span:
            fresh = [
                run_tool(tools, call, False, self.clock, tenant)
                for call, hit in zip(turn.invocations, hits, strict=True) if hit is None
            ]
            telemetry.set_attributes(span, {"ooo_spec.tools.fresh": len(fresh),
                                            "ooo_spec.tools.reused": len(hits) - len(fresh)})
            ran = iter(await asyncio.gather(*fresh))
        runs = [hit if hit is not None else next(ran) for hit in hits]
        # Critical-path tool time: from the commit until the last result was in.
        state.tools_ms += max(0.0, self.clock() - turn.commit) * 1000
        for call_id, run in zip(turn.call_ids, runs, strict=True):
            state.tool_results.append(run.report(call_id, turn.commit))
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": turn.final.content or None,
            "tool_calls": self._tool_calls(turn),
        }
        replies = [
            {"role": "tool", "tool_call_id": call_id,
             "content": run.result.content if run.result is not None else ""}
            for call_id, run in zip(turn.call_ids, runs, strict=True)
        ]
        return [assistant, *replies]

    async def _report_ready(self, turn: _Turn, state: LoopState) -> None:
        """A turn going back to the client: report the pre-executed results that already
        answer its calls, and stop the rest."""
        with telemetry.span("reconcile") as span:
            hits = (await turn.pre.settle(turn.invocations, wait=False) if turn.pre is not None
                    else [None] * len(turn.invocations))
            self._reconciled(span, turn, state, hits)
        for call_id, hit in zip(turn.call_ids, hits, strict=True):
            if hit is not None:
                state.tool_results.append(hit.report(call_id, turn.commit))

    def _reconciled(
        self, span: Span, turn: _Turn, state: LoopState, hits: Sequence[ToolRun | None]
    ) -> None:
        """Account for what pre-execution gave this turn (the `reconcile` span, the metrics)."""
        dispatched = turn.pre.dispatched if turn.pre is not None else 0
        used = sum(1 for hit in hits if hit is not None)
        state.pre_executed += dispatched
        state.pre_used += used
        saved = sum(hit.report("", turn.commit).saved_ms for hit in hits if hit is not None)
        telemetry.set_attributes(span, telemetry.reconcile_attributes(
            state.outcomes[-1], dispatched, used, saved))

    def _next_request(
        self,
        original: ChatCompletionRequest,
        current: ChatCompletionRequest,
        messages: list[dict[str, Any]],
        state: LoopState,
        left: int | None = None,
    ) -> ChatCompletionRequest:
        """The next turn's request: the conversation so far, and at most the tokens the
        request has `left` (every turn counts against its one `max_tokens`)."""
        data = current.model_dump(exclude_none=True)
        data["messages"] = [*data["messages"], *messages]
        if left is not None:
            for key in ("max_tokens", "max_completion_tokens"):
                if key in data:
                    data[key] = min(data[key], left)
            if "max_completion_tokens" not in data:
                data["max_tokens"] = min(data.get("max_tokens", left), left)
        if state.rounds >= original.ooo_spec.max_steps:
            # The tool budget is spent: one last turn that must answer in text.
            data["tool_choice"] = "none"
        return ChatCompletionRequest.model_validate(data)

    @staticmethod
    def _tool_calls(turn: _Turn) -> list[dict[str, Any]]:
        return [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": json.dumps(c.arguments, ensure_ascii=False),
                },
            }
            for call_id, c in zip(turn.call_ids, turn.invocations, strict=True)
        ]

    def completion(
        self,
        request: ChatCompletionRequest,
        turn: _Turn,
        state: LoopState,
        started: float,
    ) -> dict[str, Any]:
        final = turn.final
        tool_calls = self._tool_calls(turn)
        message: dict[str, Any] = {"role": "assistant", "content": final.content}
        if final.reasoning is not None:
            # vLLM 0.32 names it `reasoning`; `reasoning_content` for clients of older vLLM.
            message["reasoning"] = message["reasoning_content"] = final.reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = final.finish_reason or "stop"
        if tool_calls and finish == "stop":
            finish = "tool_calls"
        # Usage over every turn the request caused (what it cost), like `main` in the report.
        prompt_tokens = sum(f.prompt_tokens for f in state.finals)
        completion_tokens = sum(f.completion_tokens for f in state.finals)
        report = self.report(request, state, started)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            # `stop_reason`: the stop string that ended the output, as vLLM reports it.
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "stop_reason": final.stop_reason,
                         "logprobs": _logprobs(request, final.logprobs)}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                # As OpenAI reports it: the prompt tokens the prefix cache served.
                "prompt_tokens_details": {"cached_tokens": report.main.cached_tokens},
            },
            "ooo_spec": report.model_dump(),
        }

    def outcome(self, request: ChatCompletionRequest, final: TurnResult,
                decision: SidecarDecision | None = None) -> Outcome:
        schemas = request.tool_schemas()
        return classify_outcome(
            speculated=self.wants_sidecar(request),
            sidecar_status=("skipped" if decision is not None and not decision.call
                            else final.sidecar.status),
            sidecar_no_call=final.sidecar.no_call,
            candidates=[(Invocation(name=c.name, arguments=c.arguments), c.valid)
                        for c in final.candidates],
            committed=final.calls,
            schemas=schemas,
        )

    def report(
        self, request: ChatCompletionRequest, state: LoopState, started: float
    ) -> OooSpecReport:
        """The `ooo_spec` object; over a loop, candidates are concatenated, counts and times
        summed (`agent_loop.sum_main`), outcomes combined (`agent_loop.combine_outcomes`)."""
        finals = state.finals
        first_commit = state.first_commit if state.first_commit is not None else self.clock()
        return OooSpecReport(
            enabled=self.wants_sidecar(request),
            outcome=combine_outcomes(state.outcomes),
            baseline=request.ooo_spec.baseline,
            candidates=[c for f in finals for c in f.candidates],
            main=sum_main(f.main for f in finals),
            tool_results=state.tool_results,
            predictions=state.predictions,
            timings_ms=TimingsReport(
                total=(self.clock() - started) * 1000,
                sidecar=sum(f.sidecar.elapsed_ms for f in finals),
                main=sum(f.main_ms for f in finals),
                tools=state.tools_ms,
                first_commit=(first_commit - started) * 1000,
            ),
            sidecar_decisions=state.sidecar_decisions,
            routing=state.routes,
            no_drafts_reason=(request.draft_free_reason() if request.ooo_spec.enabled
                              else None),
        )


def tokens_left(budget: int | None, state: LoopState) -> int | None:
    """Of a request's token budget (None: unbounded), what its turns so far left: the agent
    loop's turns share one budget, the one the request checks counted (`max_tokens`, or the
    server's ceiling), so `max_tokens` bounds the usage summed over every turn.

    >>> tokens_left(None, LoopState()) is None
    True
    """
    if budget is None:
        return None
    return budget - sum(final.completion_tokens for final in state.finals)


# All a client learns of a prediction that failed or was skipped: the detail (an exception's
# text, the router's count of pending sidecar calls) would tell it about the server and about
# other tenants' load, so it is logged here instead.
PREDICTION_FAILED = "the sidecar's prediction failed"


def route_report(final: TurnResult, decision: AffinityDecision | None) -> RouteReport:
    """Where a main call ran: its replica and prefix-cache hit (from the replica), and how
    cache-affinity routing chose it (None: Serve's own router did)."""
    return RouteReport(
        replica=final.replica,
        prompt_tokens=final.prompt_tokens,
        cached_tokens=final.main.cached_tokens,
        decision=decision.reason if decision is not None else None,
        matched_chars=decision.matched if decision is not None else 0,
    )


async def observe_prediction(prediction: Awaitable[Any], clock: Clock) -> PredictionReport:
    """The sidecar's prediction as the router saw it arrive (`await_prediction`), for the
    agreement measurement: its first candidate, whenever it came. Only this prediction's own
    numbers (its time, its passes), and `PREDICTION_FAILED` for any failure."""
    started = clock()
    try:
        raw = await prediction
        parsed = Prediction.model_validate(raw)
    except Exception as exc:  # noqa: BLE001 - reported, never raised: it is a measurement
        logger.warning("sidecar prediction failed: %s: %s", type(exc).__name__, exc)
        return PredictionReport(ready_ms=(clock() - started) * 1000, error=PREDICTION_FAILED)
    if parsed.error:
        logger.info("sidecar prediction not made: %s", parsed.error)
    first = parsed.candidates[0] if parsed.candidates else []
    return PredictionReport(
        ready_ms=(clock() - started) * 1000,
        elapsed_ms=parsed.elapsed_ms,
        passes=parsed.passes,
        calls=[{"name": c.name, "arguments": c.arguments} for c in first],
        no_call=parsed.no_call,
        error=PREDICTION_FAILED if parsed.error else None,
    )


def _logprobs(
    request: ChatCompletionRequest, content: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """A choice's (or chunk's) `logprobs` object, when the request asked for them."""
    if not request.logprobs:
        return None
    return {"content": content or []}


def merge_completions(completions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One completion with a choice per completion (`n` > 1); `ooo_spec` is the first
    choice's."""
    first = completions[0]
    if len(completions) == 1:
        return first
    choices = [{**c["choices"][0], "index": i} for i, c in enumerate(completions)]
    return {**first, "choices": choices, "usage": merged_usage(completions)}


def choice_requests(request: ChatCompletionRequest) -> list[ChatCompletionRequest]:
    """One request per choice. As vLLM's parallel sampling: with a `seed`, choice i samples
    with `seed + i`; without, each samples on its own."""
    n = request.n or 1
    if n == 1:
        return [request]
    data = request.model_dump(exclude_none=True)
    data.pop("n")
    out: list[ChatCompletionRequest] = []
    for index in range(n):
        one = dict(data)
        if request.seed is not None:
            one["seed"] = request.seed + index
        out.append(ChatCompletionRequest.model_validate(one))
    return out
