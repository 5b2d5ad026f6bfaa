"""The pieces of the `execute_tools` agent loop that are not the loop itself (that is
`ChatService._events` in chat_service.py): what starting the sidecar gives a turn, the state
the loop accumulates, and folding its turns into one report. Pre-execution lives in
pre_execution.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.openai_models import (
    MainReport,
    PredictionReport,
    RouteReport,
    SidecarDecision,
    ToolResultReport,
)
from app.speculation.reconcile import Outcome
from app.speculation.turn import TurnResult


@dataclass
class SidecarStart:
    """What starting the sidecar gives the router: the token the main call carries (in the
    deployment, the relay the main replica's `ObjectRef` of its sidecar call comes back to)
    and the prediction as an awaitable of the `Prediction` dict, for pre-execution. Awaiting
    it never delays the main call, which already has the token.

    `token` None: the deployment did not call the sidecar after all (its gate found too many
    calls pending, app/api/sidecar_gate.py); the turn then goes exactly as with the sidecar
    off (`ooo_spec.sidecar: false`), reported as skipped with reason `busy`."""

    token: Any
    prediction: Awaitable[Any] | None = None
    # Stops the sidecar's work; called once the turn's main call has ended, whichever way.
    cancel: Callable[[], None] | None = None


def sum_main(reports: Iterable[MainReport]) -> MainReport:
    """`main` over the loop's turns: counts and decode time summed; `ttft_ms` is the first
    turn's (the first token the request produced)."""
    total = MainReport()
    for index, main in enumerate(reports):
        total.steps += main.steps
        total.completion_tokens += main.completion_tokens
        total.drafted_tokens += main.drafted_tokens
        total.accepted_tokens += main.accepted_tokens
        total.decode_ms += main.decode_ms
        total.cached_tokens += main.cached_tokens
        total.sources.add(main.sources)
        if index == 0:
            total.ttft_ms = main.ttft_ms
    return total


def combine_outcomes(outcomes: list[Outcome]) -> Outcome:
    """One outcome for the loop: the common one when every speculated turn agrees; 'partial'
    when they differ and at least one turn's prediction was (partly) right; otherwise the first
    speculated turn's. Turns that did not speculate (the final `tool_choice: none` answer) do
    not count unless no turn speculated."""
    speculated = [o for o in outcomes if o != "disabled"]
    if not speculated:
        return "disabled"
    if all(o == speculated[0] for o in speculated):
        return speculated[0]
    if any(o in ("hit", "partial") for o in speculated):
        return "partial"
    return speculated[0]


@dataclass
class LoopState:
    """What the loop accumulates over its turns."""

    finals: list[TurnResult] = field(default_factory=list)
    routes: list[RouteReport] = field(default_factory=list)  # one per final, in order
    predictions: list[PredictionReport] = field(default_factory=list)  # `await_prediction`
    sidecar_decisions: list[SidecarDecision] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    tool_results: list[ToolResultReport] = field(default_factory=list)
    tools_ms: float = 0.0
    rounds: int = 0  # turns whose calls the server executed
    first_commit: float | None = None  # clock reading of the first turn's commit
    pre_executed: int = 0  # speculative runs dispatched, over all turns
    pre_used: int = 0  # of those, runs whose result answered a committed call
