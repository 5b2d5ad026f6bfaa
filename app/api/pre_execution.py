"""Speculative pre-execution of server-known tools while the main model decodes, and the
timing of every tool run of a chat completion.

No Ray here: the router hands in a `ToolAccess` (the ToolWorker pool behind two coroutines) and
the sidecar's prediction as a plain awaitable, so everything below runs in unit tests with
fakes. Which calls may run early and which result answers a committed call is decided in
`app/tools/policy.py` (`may_pre_execute`, `PreExecutionLedger`).

Definitions (they are what `ooo_spec.tool_results` reports):
- *dispatch*: the moment the router sends a call to the tool pool; *finish*: the moment its
  result is back in the router; *commit*: the moment the main model's result (the parsed
  calls) reaches the router. All three are router clock readings, so Ray hops count as tool time.
- `latency_ms` = finish - dispatch (what the request would wait for this call on its own).
- `saved_ms` = the part of [dispatch, finish] that overlapped decoding, i.e.
  max(0, min(finish, commit) - dispatch) = min(latency, commit - dispatch). A call run after the
  commit saves nothing (0).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from app.openai_models import ToolResultReport
from app.speculation.canonical import Invocation
from app.speculation.prediction import Prediction
from app.speculation.validation import validate_arguments
from app.tenancy import ANONYMOUS_TENANT
from app.tools.policy import PreExecutionLedger
from app.tools.registry import ToolResult, ToolSpec

Clock = Callable[[], float]

logger = logging.getLogger(__name__)


class ToolAccess(Protocol):
    """The tool worker pool as the router sees it."""

    async def specs(self) -> Mapping[str, ToolSpec]:
        """Server-registered tools by name (cached by the implementation)."""
        ...

    async def execute(
        self, name: str, arguments: dict[str, Any], speculative: bool, tenant: str
    ) -> ToolResult:
        """Run one call for `tenant` (the tool runs in its context: app/tools/call_context.py);
        never raises for tool failures. Cancelling the awaiting task must cancel the remote work
        where the pool can."""
        ...


@dataclass(frozen=True)
class ToolPolicy:
    """`tool_worker.pre_execute` / `allow_egress`, as the router applies them."""

    pre_execute: bool = True
    allow_egress: bool = False


@dataclass
class ToolRun:
    """One execution as the router timed it."""

    invocation: Invocation
    dispatched: float
    speculative: bool
    finished: float | None = None
    result: ToolResult | None = None

    def report(self, tool_call_id: str, commit: float) -> ToolResultReport:
        assert self.result is not None and self.finished is not None
        saved = max(0.0, min(self.finished, commit) - self.dispatched) if self.speculative else 0.0
        return ToolResultReport(
            tool_call_id=tool_call_id,
            name=self.invocation.name,
            content=self.result.content,
            speculative=self.speculative,
            latency_ms=(self.finished - self.dispatched) * 1000,
            saved_ms=saved * 1000,
        )


async def run_tool(
    tools: ToolAccess, invocation: Invocation, speculative: bool, clock: Clock,
    tenant: str = ANONYMOUS_TENANT,
) -> ToolRun:
    """Execute one call for `tenant` through the pool and time it; a pool failure becomes an
    error result (the model reads it like any other tool error), cancellation propagates."""
    run = ToolRun(invocation, clock(), speculative)
    try:
        result = await tools.execute(invocation.name, dict(invocation.arguments), speculative,
                                     tenant)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the pool is down or the call was lost
        logger.warning("tool %r could not run: %s: %s", invocation.name,
                       type(exc).__name__, exc)
        # What happened, never the exception's own text (it can carry internals).
        what = "did not answer in time" if isinstance(exc, TimeoutError) else "could not run"
        result = ToolResult(
            name=invocation.name,
            content=f"tool {invocation.name!r} {what}",
            is_error=True,
            latency_ms=(clock() - run.dispatched) * 1000,
        )
    run.finished = clock()
    run.result = result
    return run


def speculable_calls(
    prediction: Prediction,
    request_schemas: Mapping[str, Mapping[str, Any]],
    server_tools: Mapping[str, ToolSpec],
    named_tool: str | None,
) -> list[Invocation]:
    """Predicted calls worth pre-executing, best alternative first: valid against the request's
    schema for that tool, naming a tool both the request offers and the server runs, and the
    forced tool when `tool_choice` names one (the main model cannot commit any other)."""
    if prediction.error or prediction.no_call:
        return []
    out: list[Invocation] = []
    for group in prediction.candidates:
        for call in group:
            schema = request_schemas.get(call.name)
            if schema is None or call.name not in server_tools:
                continue
            if named_tool is not None and call.name != named_tool:
                continue
            if validate_arguments(call.arguments, schema):
                continue
            out.append(Invocation(name=call.name, arguments=dict(call.arguments)))
    return out


class PreExecution:
    """The speculative runs of one main-model turn.

    `watch` starts a background task that waits for the sidecar's prediction and dispatches each
    allowed call at once (the ledger admits a canonical call once, and only when
    `may_pre_execute` holds). `settle` pairs the committed calls with finished (or, if asked,
    in-flight) runs; `cancel` stops everything left, which at the commit means mispredictions.
    """

    def __init__(
        self,
        tools: ToolAccess,
        policy: ToolPolicy,
        request_schemas: Mapping[str, Mapping[str, Any]],
        named_tool: str | None = None,
        clock: Clock = time.perf_counter,
        tenant: str = ANONYMOUS_TENANT,
    ) -> None:
        self._tools = tools
        self._tenant = tenant
        self._policy = policy
        self._schemas = dict(request_schemas)
        self._named_tool = named_tool
        self._clock = clock
        self._ledger: PreExecutionLedger | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._runs: dict[str, asyncio.Task[ToolRun]] = {}
        self._done: dict[str, ToolRun] = {}

    def watch(self, prediction: Awaitable[Any]) -> None:
        self._watcher = asyncio.ensure_future(self._on_prediction(prediction))

    @property
    def dispatched(self) -> int:
        return len(self._runs)

    async def _on_prediction(self, prediction: Awaitable[Any]) -> None:
        try:
            # The registry lookup runs beside the sidecar, so no request waits for it here.
            specs = await self._tools.specs()
            # Only tools this request offers are server-known for it (docs/tools.md).
            offered = {name: spec for name, spec in specs.items() if name in self._schemas}
            ledger = self._ledger = PreExecutionLedger(
                offered,
                global_enabled=self._policy.pre_execute,
                allow_egress=self._policy.allow_egress,
            )
            parsed = Prediction.model_validate(await prediction)
        except (ValidationError, TypeError):
            return
        except Exception:  # noqa: BLE001 - a failed sidecar or pool only means no pre-execution
            return

        def keyed_calls() -> list[tuple[Invocation, str]]:
            calls = speculable_calls(parsed, self._schemas, offered, self._named_tool)
            return [(call, ledger.key(call)) for call in calls]

        # Validation against the client's schemas and canonical keys (defaults filled through
        # the tools' schemas) run off the router's event loop.
        for invocation, key in await asyncio.to_thread(keyed_calls):
            if ledger.start(invocation, key):
                self._runs[key] = asyncio.ensure_future(self._run(key, invocation))

    async def _run(self, key: str, invocation: Invocation) -> ToolRun:
        run = await run_tool(self._tools, invocation, True, self._clock, self._tenant)
        assert self._ledger is not None and run.result is not None
        self._ledger.record(invocation, run.result, key)
        self._done[key] = run
        return run

    async def settle(self, committed: Iterable[Invocation], wait: bool) -> list[ToolRun | None]:
        """Per committed call, in order: the pre-executed run that answers it, or None.

        No new pre-execution starts after this (the prediction is moot once the call is
        committed). With `wait`, a matching run still in flight is awaited (the caller would
        run the same call otherwise); without, only runs finished by now count. Everything not
        taken is cancelled afterwards."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        out: list[ToolRun | None] = []
        ledger = self._ledger
        calls = list(committed)
        if ledger is None:
            self.cancel()
            return [None] * len(calls)
        keys = await asyncio.to_thread(lambda: [ledger.key(call) for call in calls])
        for invocation, key in zip(calls, keys, strict=True):
            task = self._runs.get(key)
            if wait and task is not None and ledger.is_pending(invocation, key):
                # asyncio.wait, not `await task`: a run cancelled on its own must not look like
                # this request being cancelled (that still propagates from here).
                await asyncio.wait({task})
            result = ledger.take(invocation, key)
            out.append(self._done[key] if result is not None else None)
        self.cancel()
        return out

    def cancel(self) -> None:
        """Stop the watcher and every run still in flight (their results are not needed)."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        for task in self._runs.values():
            if not task.done():
                task.cancel()
