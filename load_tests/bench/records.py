"""Requests and records: one case in one mode as the `openai` client's keyword arguments, the
`Record` a response (or a failure) gives, and what is marked on the records afterwards
(identical to plain's output, the sidecar's agreement with plain's call)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.datasets.agent_scenarios import AgentCase
from app.speculation.canonical import Invocation, canonical_invocation
from load_tests.bench.datasets import PARALLEL_CATEGORIES, AutoCase, Case, case_source
from load_tests.bench.modes import BASELINE, SIDECAR, SIDECAR_BASE, SIDECAR_VERIFY, Mode
from load_tests.bfcl import BfclCase, score_calls
from load_tests.bfcl_multi import MultiTurnStep, score_step


@dataclass
class RequestSettings:
    model: str
    max_tokens: int = 256
    temperature: float = 0.0
    tool_choice: str = "required"


def build_request(case: Case, mode: Mode, settings: RequestSettings) -> dict[str, Any]:
    """Keyword arguments of `client.chat.completions.create` for one case in one mode."""
    if isinstance(case, AutoCase):
        kwargs = build_request(case.inner, mode, settings)
        kwargs["tool_choice"] = "auto"
        return kwargs
    kwargs: dict[str, Any] = {
        "model": settings.model,
        "messages": case.messages,
        "tools": case.tools,
        "tool_choice": settings.tool_choice,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "extra_body": json.loads(json.dumps(mode.extra_body)),  # a private copy
    }
    if isinstance(case, AgentCase):
        # Every mode runs the agent loop, so all pay for the same tool executions.
        kwargs["tool_choice"] = case.tool_choice
        kwargs["max_tokens"] = min(settings.max_tokens, case.max_tokens)
        options = kwargs["extra_body"].setdefault("ooo_spec", {})
        options.update(execute_tools=True, max_steps=case.max_steps, server_tools=True)
    else:
        # Every mode asks the same question: a call remembered from another mode's run would
        # answer it (history candidates are for agents that repeat themselves), so history is
        # off. The tenant's earlier outputs (the `suffix` source) stay on, in an index of the
        # mode's own (one tenant sends every mode): like vLLM's `suffix` engine, which sees
        # only its own requests, each mode remembers its earlier cases and turns, never another
        # mode's answer to the same question.
        options = kwargs["extra_body"].setdefault("ooo_spec", {})
        options["history"] = False
        options.setdefault("diagnostics", {})["suffix_scope"] = f"bench:{mode.name}"
        if case.category in PARALLEL_CATEGORIES:
            kwargs["parallel_tool_calls"] = True
    return kwargs


@dataclass
class Record:
    """One request: what was sent (case, mode) and what came back."""

    case_id: str
    category: str
    mode: str
    position: int  # place of this mode in the case's rotated order (0 = first)
    warmup: bool = False
    error: str | None = None
    e2e_ms: float = 0.0
    source: str = "bfcl"
    # bfcl-multi: the conversation and the call's position in it (0 = its first call).
    conversation: str | None = None
    call_index: int | None = None
    first_commit_ms: float | None = None  # time to the committed tool call (server clock)
    tools_ms: float | None = None  # tool wait after the commits (agent loop)
    baseline: str | None = None  # the comparison engine that decoded, if any
    # Server-run tools: {name, content, speculative, saved_ms}.
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    steps: int | None = None
    completion_tokens: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    # Per draft source (`ooo_spec.main.sources`): {source: {drafted_tokens, accepted_tokens,
    # gain_tokens}}; empty where the server does not report them.
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    ttft_ms: float | None = None
    decode_ms: float | None = None
    sidecar_ms: float | None = None
    server_total_ms: float | None = None
    candidate_ready_ms: float | None = None  # first candidate
    candidates: int = 0
    finish_reason: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # {name, arguments (JSON)}
    correct: bool | None = None
    identical_to_plain: bool | None = None
    # `sidecar` mode: the prediction as the router saw it arrive, and whether it equals the
    # plain run's committed call (canonically; only the required arguments).
    prediction_ready_ms: float | None = None
    prediction_passes: int | None = None  # the sidecar engine's forward passes meanwhile
    prediction_calls: list[dict[str, Any]] | None = None
    agrees_whole: bool | None = None
    agrees_required: bool | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def output(self) -> tuple[Any, ...]:
        """What must equal the plain run's: the content, the calls and what the server's tools
        returned, byte for byte."""
        return (
            self.content,
            tuple((c["name"], c["arguments"]) for c in self.tool_calls),
            tuple((t["name"], t["content"]) for t in self.tool_results),
        )


def _extras(response: Any) -> dict[str, Any]:
    extra = getattr(response, "model_extra", None) or {}
    report = extra.get("ooo_spec")
    if report is None:
        report = getattr(response, "ooo_spec", None)
    return report if isinstance(report, dict) else {}


def record_from_response(
    response: Any, case: Case, mode: str, position: int, e2e_ms: float, warmup: bool = False
) -> Record:
    """A `Record` from a parsed `ChatCompletion` (with its `ooo_spec` extra)."""
    report = _extras(response)
    inner = case.inner if isinstance(case, AutoCase) else case
    main = report.get("main") or {}
    timings = report.get("timings_ms") or {}
    candidates = report.get("candidates") or []
    predictions = report.get("predictions") or []
    choice = response.choices[0]
    message = choice.message
    calls = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in (message.tool_calls or [])
    ]
    usage = getattr(response, "usage", None)
    completion_tokens = main.get("completion_tokens")
    if completion_tokens is None and usage is not None:
        completion_tokens = usage.completion_tokens
    return Record(
        case_id=case.id,
        category=case.category,
        mode=mode,
        position=position,
        warmup=warmup,
        e2e_ms=e2e_ms,
        outcome=report.get("outcome"),
        steps=main.get("steps"),
        completion_tokens=completion_tokens,
        drafted_tokens=main.get("drafted_tokens"),
        accepted_tokens=main.get("accepted_tokens"),
        sources={name: {k: int(v) for k, v in tally.items() if isinstance(v, int | float)}
                 for name, tally in (main.get("sources") or {}).items()
                 if isinstance(tally, dict)},
        ttft_ms=main.get("ttft_ms"),
        decode_ms=main.get("decode_ms"),
        sidecar_ms=timings.get("sidecar"),
        server_total_ms=timings.get("total"),
        # The sidecar's: history candidates (past calls) are there at time zero.
        candidate_ready_ms=next((c.get("ready_ms") for c in candidates
                                 if c.get("source", "sidecar") == "sidecar"), None),
        candidates=len(candidates),
        finish_reason=choice.finish_reason,
        content=message.content,
        tool_calls=calls,
        # The agent set has no ground truth: its point is the same answer in every mode.
        correct=(score_output(calls, inner) if isinstance(inner, BfclCase)
                 else score_step(calls, inner) if isinstance(inner, MultiTurnStep) else None),
        source=case_source(case),
        conversation=inner.conversation if isinstance(inner, MultiTurnStep) else None,
        call_index=inner.index if isinstance(inner, MultiTurnStep) else None,
        first_commit_ms=timings.get("first_commit"),
        tools_ms=timings.get("tools"),
        baseline=report.get("baseline"),
        prediction_ready_ms=predictions[0].get("ready_ms") if predictions else None,
        prediction_passes=predictions[0].get("passes") if predictions else None,
        prediction_calls=predictions[0].get("calls") if predictions else None,
        tool_results=[
            {"name": t.get("name"), "content": t.get("content"),
             "speculative": bool(t.get("speculative")), "saved_ms": t.get("saved_ms", 0.0)}
            for t in report.get("tool_results") or []
        ],
    )


def score_output(calls: Sequence[Mapping[str, str]], case: BfclCase) -> bool:
    """BFCL correctness of the committed calls; unparsable arguments count as wrong."""
    invocations: list[Invocation] = []
    for call in calls:
        try:
            arguments = json.loads(call["arguments"] or "{}")
        except (TypeError, ValueError):
            return False
        if not isinstance(arguments, dict):
            return False
        invocations.append(Invocation(name=call["name"], arguments=arguments))
    return score_calls(invocations, case)


def describe_error(exc: BaseException) -> str:
    """One line: HTTP status and the server's message when there is one."""
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else str(error)
    text = message or str(exc) or type(exc).__name__
    prefix = f"HTTP {status}: " if status is not None else f"{type(exc).__name__}: "
    return prefix + text


def mark_identity(records: Sequence[Record], baseline: str = BASELINE) -> None:
    """Set `identical_to_plain` on every successful record whose case has a successful
    baseline run (warm-ups excluded); the baseline's own records are identical by definition."""
    reference = {
        r.case_id: r.output() for r in records if r.mode == baseline and r.ok and not r.warmup
    }
    for r in records:
        if r.warmup or not r.ok or r.case_id not in reference:
            r.identical_to_plain = None
        else:
            r.identical_to_plain = r.output() == reference[r.case_id]


def mark_agreement(
    records: Sequence[Record], cases: Sequence[Case], baseline: str = BASELINE
) -> None:
    """Set `agrees_whole` / `agrees_required` on `sidecar` records: the prediction against the
    baseline's committed call of the same case. Cases where the baseline committed no call
    (its output cut short) have nothing to agree with and stay None."""
    schemas = {
        c.id: {t["function"]["name"]: t["function"].get("parameters") or {} for t in c.tools}
        for c in cases
    }
    committed = {r.case_id: r.tool_calls for r in records
                 if r.mode == baseline and r.ok and not r.warmup and r.tool_calls}
    for r in records:
        if (r.mode not in (SIDECAR, SIDECAR_VERIFY, SIDECAR_BASE) or r.warmup
                or r.case_id not in committed):
            continue
        try:
            main = [Invocation(name=c["name"], arguments=json.loads(c["arguments"]))
                    for c in committed[r.case_id]]
        except (json.JSONDecodeError, TypeError):
            continue
        predicted = [Invocation(name=c["name"], arguments=c.get("arguments") or {})
                     for c in r.prediction_calls or []]
        r.agrees_whole = same_calls(predicted, main, schemas[r.case_id], required_only=False)
        r.agrees_required = same_calls(predicted, main, schemas[r.case_id], required_only=True)


def same_calls(
    a: Sequence[Invocation], b: Sequence[Invocation], schemas: Mapping[str, dict[str, Any]],
    required_only: bool,
) -> bool:
    """Canonical equality of two call lists, in order; `required_only` compares the tool
    names and the required arguments only."""
    def key(call: Invocation) -> str:
        schema = schemas.get(call.name) or {}
        if required_only:
            required = set(schema.get("required") or [])
            call = Invocation(name=call.name,
                              arguments={k: v for k, v in call.arguments.items() if k in required})
            return canonical_invocation(call, None)
        return canonical_invocation(call, schema)

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b, strict=True))
