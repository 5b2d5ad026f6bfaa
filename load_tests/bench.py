"""The benchmark (`python -m load_tests.bench`, or `ooo-spec bench` from the repository root):
the same cases, several decoding modes, one server.

A *mode* is a name plus the request extras that select it: `plain` (`ooo_spec.enabled: false`,
the baseline), `ngram` (vLLM's own prompt-lookup speculation on the server's second main engine,
`ooo_spec.baseline: "ngram"`), `suffix` (vLLM's own suffix decoding on a further main engine,
`ooo_spec.baseline: "suffix"`; needs arctic-inference), `ooo` (sidecar candidates, no
pre-execution) and `ooo+tools`
(the same plus speculative pre-execution of server-known tools; only on the `agent` set, since
BFCL's tools are unknown to the server). Modes live in `MODES`; add one with `register_mode`.

Datasets: BFCL categories (`bfcl:simple_python,multiple,...`), the multi-turn agent scenario set
(`agent`, app/datasets/agent_scenarios.py), and BFCL's multi-turn conversations replayed call by
call (`bfcl-multi:multi_turn_base`, load_tests/bfcl_multi.py; `--limit` counts conversations),
reported per call, by position in the conversation and per conversation. The `auto` dataset asks
the same questions with `tool_choice: auto`, as agent frameworks do (`bfcl-auto:<category>`,
`agent-auto`; `auto` is `bfcl-auto:simple_python,multiple` and `agent-auto`): the model may
answer in text or call, and its cases are reported apart (`main passes / call` counts passes per
committed call). Agent requests run the server-side agent loop (`execute_tools: true`) in every
mode, so every mode pays for the same tool executions and only `ooo+tools` may start them early.

Requests are interleaved case by case: for each case every mode runs once, and the order of
the modes rotates from one case to the next, so no mode always goes first (cold caches, a
neighbour's load spike) or last. `--warmup N` requests per mode run before, and are kept in the
JSON output but left out of every statistic.

Each request is one `openai` client call (the real SDK, `extra_body` carrying `ooo_spec`); the
`ooo_spec` report is read from the parsed response's extra fields. "Time to the committed tool
call" is the server's `timings_ms.first_commit` (router clock, request arrival to the first
turn's parsed calls): non-streamed and streamed responses alike deliver the calls only once
they are parsed, and on the agent set the calls are never sent to the client at all.

A request either gives a `Record` with the server's numbers, or a `Record` with `error` set;
each has a timeout, and the run aborts after `max_consecutive_errors` failures in a row, when
`max_duration_s` is spent, or when a warm-up request is refused (4xx: a mode the server cannot
serve), so it always ends by itself.

The statistics (`summarize`) are pure functions of the records: `report.py` prints and plots
them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from app.datasets.agent_scenarios import AgentCase
from app.speculation.canonical import Invocation, canonical_invocation
from load_tests.bfcl import CORE_CATEGORIES, SUPPORTED_CATEGORIES, BfclCase, load_bfcl, score_calls
from load_tests.bfcl_multi import MULTI_CATEGORIES, MultiTurnStep, load_bfcl_multi, score_step

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
BASELINE = "plain"
# The second baseline every ratio is also given against, when the run has it.
PEER = "ngram"
SUFFIX = "suffix"  # vLLM's suffix decoding: the other peer ratios are given against
PEERS = (PEER, SUFFIX)
AGENT_SOURCE = "agent"
SIDECAR = "sidecar"
SIDECAR_VERIFY = "sidecar+verify"
SIDECAR_BASE = "sidecar:base"  # the sidecar without its LoRA adapter (sidecar.lora)
DRAFTS = "drafts"
BFCL_AUTO = "bfcl-auto"
AGENT_AUTO = "agent-auto"
BFCL_MULTI = "bfcl-multi"
AGENT_SOURCES = frozenset({AGENT_SOURCE, AGENT_AUTO})
PARALLEL_CATEGORIES = frozenset(c for c in SUPPORTED_CATEGORIES if "parallel" in c)


@dataclass(frozen=True)
class AutoCase:
    """A case of the `auto` dataset: a BFCL question or an agent scenario asked with
    `tool_choice: auto` (the model chooses between a text answer and a call)."""

    inner: BfclCase | AgentCase

    @property
    def id(self) -> str:  # apart from the same question asked in forced mode in one run
        return f"{self.inner.id}@auto"

    @property
    def category(self) -> str:
        return self.inner.category

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.inner.messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.inner.tools


Case = BfclCase | AgentCase | AutoCase | MultiTurnStep


# ---------------------------------------------------------------- modes


@dataclass(frozen=True)
class Mode:
    """A decoding mode: the extra request body (merged into `extra_body`) that selects it."""

    name: str
    extra_body: Mapping[str, Any]
    description: str = ""
    sources: frozenset[str] | None = None  # dataset sources it runs on; None = all

    def applies_to(self, source: str) -> bool:
        return self.sources is None or source in self.sources


MODES: dict[str, Mode] = {}


def register_mode(
    name: str,
    extra_body: Mapping[str, Any],
    description: str = "",
    sources: Iterable[str] | None = None,
) -> Mode:
    """Add (or replace) a mode; `--modes` then accepts `name`."""
    if not name or "," in name or name != name.strip():
        raise ValueError(f"bad mode name {name!r}")
    mode = Mode(name, dict(extra_body), description,
                frozenset(sources) if sources is not None else None)
    MODES[name] = mode
    return mode


register_mode(BASELINE, {"ooo_spec": {"enabled": False}}, "plain decoding (the baseline)")
register_mode(PEER, {"ooo_spec": {"enabled": False, "baseline": "ngram"}},
              "vLLM's own n-gram (prompt lookup) speculation on the second main engine")
# vLLM's suffix decoding at its defaults, what a team serving an agent would run instead.
register_mode(SUFFIX, {"ooo_spec": {"enabled": False, "baseline": SUFFIX}},
              "vLLM's own suffix decoding (arctic-inference) on a further main engine")
register_mode("ooo", {"ooo_spec": {"enabled": True, "pre_execute": False}},
              "out-of-order semantic speculation, no tool pre-execution")
# What the sidecar adds: the same drafting from the tool schemas and prompt lookup, no sidecar.
register_mode(DRAFTS, {"ooo_spec": {"enabled": True, "pre_execute": False, "sidecar": False}},
              "speculation without the sidecar: schema drafts and prompt lookup only")
register_mode("ooo+tools", {"ooo_spec": {"enabled": True, "pre_execute": True}},
              "speculation plus pre-execution of predicted server-known tools",
              sources=AGENT_SOURCES)
# What re-alignment after a divergence is worth: drafting stops at the first mismatch.
register_mode("ooo:no-realign",
              {"ooo_spec": {"enabled": True, "pre_execute": False,
                            "diagnostics": {"realign": False}}},
              "speculation without re-alignment (prefix-only drafting)", sources=["bfcl"])
# The sidecar's own numbers: the response waits for its prediction, even a late one, so its
# readiness and agreement with plain's call are measured on every case (latency not comparable).
register_mode(SIDECAR, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                     "diagnostics": {"await_prediction": True}}},
              "speculation, reporting the sidecar's prediction whenever it arrives",
              sources=["bfcl"])
register_mode(SIDECAR_VERIFY, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                            "diagnostics": {"await_prediction": True,
                                                            "verify_prediction": True}}},
              "as `sidecar`, the sidecar verifying its slots in one drafted pass",
              sources=["bfcl"])
register_mode(SIDECAR_BASE, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                          "diagnostics": {"await_prediction": True,
                                                          "sidecar_adapter": False}}},
              "as `sidecar`, the sidecar's base model without its LoRA adapter",
              sources=["bfcl"])
# What the adapter does end to end: `ooo` with the sidecar's base model.
register_mode("ooo:base", {"ooo_spec": {"enabled": True, "pre_execute": False,
                                        "diagnostics": {"sidecar_adapter": False}}},
              "as `ooo`, the sidecar's base model without its LoRA adapter")


def parse_modes(spec: str) -> list[Mode]:
    """`"plain,ooo"` -> the registered modes, in that order (no duplicates)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError("no mode given")
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(
            f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"mode listed twice in {spec!r}")
    return [MODES[n] for n in names]


def mode_order(modes: Sequence[Mode], index: int) -> list[Mode]:
    """The modes for the `index`-th case, rotated by `index` (cancels warm/cold bias)."""
    if not modes:
        return []
    shift = index % len(modes)
    return [*modes[shift:], *modes[:shift]]


# ---------------------------------------------------------------- datasets


@dataclass(frozen=True)
class DatasetSpec:
    source: str
    category: str

    def __str__(self) -> str:
        return f"{self.source}:{self.category}"


@dataclass(frozen=True)
class DatasetSource:
    """A source `--dataset` accepts: `name:<category>`, or `name` alone when it has no
    categories (a whole set). `--help` lists them from `DATASETS`."""

    name: str
    description: str
    categories: tuple[str, ...] = ()


DATASETS: dict[str, DatasetSource] = {}


def register_dataset(name: str, description: str,
                     categories: Iterable[str] = ()) -> DatasetSource:
    """Add (or replace) a dataset source; `--dataset` and `--help` then know it (loading its
    cases is `load_cases`'s job)."""
    source = DatasetSource(name, description, tuple(categories))
    DATASETS[name] = source
    return source


register_dataset("bfcl", "BFCL v4 single-turn questions, tool_choice required",
                 SUPPORTED_CATEGORIES)
register_dataset(AGENT_SOURCE, "the multi-turn agent scenarios on the server's demo and bench "
                 "tools (app/datasets/agent_scenarios.py)")
register_dataset(BFCL_AUTO, "the BFCL questions with tool_choice auto (the model may answer "
                 "in text)", SUPPORTED_CATEGORIES)
register_dataset(AGENT_AUTO, "the agent scenarios with tool_choice auto")
register_dataset(BFCL_MULTI, "BFCL's multi-turn conversations replayed call by call "
                 "(load_tests/bfcl_multi.py; needs an 8,192-token context, configs/bench.yaml; "
                 "--limit counts conversations)", MULTI_CATEGORIES)
DATASET_SOURCES = tuple(DATASETS)
# Shorthands for several categories at once.
BFCL_GROUPS: dict[str, tuple[str, ...]] = {"core": CORE_CATEGORIES}
# `auto`: the questions of the `auto` dataset.
AUTO_SET = (f"{BFCL_AUTO}:simple_python", f"{BFCL_AUTO}:multiple", AGENT_AUTO)


def parse_dataset_spec(spec: str) -> list[DatasetSpec]:
    """`"bfcl:simple_python,multiple"` or `"bfcl:simple_python,bfcl:parallel"` -> specs.

    An item without `source:` takes the source of the item before it; `bfcl:core` means the
    four core categories; `agent` is the whole agent scenario set; `bfcl-auto:<category>` and
    `agent-auto` the same with `tool_choice: auto`, and `auto` both (`AUTO_SET`);
    `bfcl-multi:<category>` BFCL's multi-turn conversations. Duplicates are dropped, order
    kept.
    """
    out: list[DatasetSpec] = []
    source: str | None = None
    items = [i for raw in spec.split(",")
             for i in (AUTO_SET if raw.strip() == "auto" else (raw,))]
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        agent = item.removesuffix(":all")
        if agent in AGENT_SOURCES:
            source = agent
            if DatasetSpec(agent, "all") not in out:
                out.append(DatasetSpec(agent, "all"))
            continue
        if ":" in item:
            source, _, category = item.partition(":")
            source, category = source.strip(), category.strip()
        else:
            category = item
        if source is None:
            raise ValueError(f"dataset {item!r} has no source; write e.g. bfcl:{item}")
        if source not in DATASETS:
            raise ValueError(
                f"unknown dataset source {source!r}; known: {', '.join(DATASETS)}"
            )
        if source in AGENT_SOURCES:
            raise ValueError(f"the agent set has no category {category!r}; write just "
                             f"'{source}'")
        if source == BFCL_MULTI:
            if category not in MULTI_CATEGORIES:
                raise ValueError(f"BFCL multi-turn category {category!r} is not supported; "
                                 f"use one of {', '.join(MULTI_CATEGORIES)}")
            if DatasetSpec(source, category) not in out:
                out.append(DatasetSpec(source, category))
            continue
        categories = BFCL_GROUPS.get(category, (category,))
        for name in categories:
            if name not in DATASETS[source].categories:
                raise ValueError(
                    f"{source} category {name!r} is not supported; use one of "
                    + ", ".join((*DATASETS[source].categories, *BFCL_GROUPS))
                )
            entry = DatasetSpec(source, name)
            if entry not in out:
                out.append(entry)
    if not out:
        raise ValueError("no dataset given")
    return out


def load_cases(
    specs: Iterable[DatasetSpec],
    limit: int | None,
    server_tools: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    conversations: int | None = None,
) -> list[Case]:
    """Cases of every spec, in order. The agent set takes its tool definitions from the
    server (`server_tools()`: the `data` of `GET /v1/tools`), so it needs that callable.
    `conversations` bounds the bfcl-multi sets (default: `limit`)."""
    from app.datasets.agent_scenarios import load_agent_cases

    cases: list[Case] = []
    for spec in specs:
        loaded: list[BfclCase] | list[AgentCase]
        if spec.source == BFCL_MULTI:
            cases += load_bfcl_multi(spec.category,
                                     conversations if conversations is not None else limit)
            continue
        if spec.source in AGENT_SOURCES:
            if server_tools is None:
                raise ValueError("the agent set needs the server's tool listing")
            loaded = load_agent_cases(server_tools(), limit)
        else:
            loaded = load_bfcl(spec.category, limit)
        if spec.source in (BFCL_AUTO, AGENT_AUTO):
            cases += [AutoCase(c) for c in loaded]
        else:
            cases += loaded
    return cases


def case_source(case: Case) -> str:
    if isinstance(case, MultiTurnStep):
        return BFCL_MULTI
    if isinstance(case, AutoCase):
        return AGENT_AUTO if isinstance(case.inner, AgentCase) else BFCL_AUTO
    return AGENT_SOURCE if isinstance(case, AgentCase) else "bfcl"


# ---------------------------------------------------------------- requests and records


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


# ---------------------------------------------------------------- the run


class BenchAborted(RuntimeError):
    pass


@dataclass
class RunLimits:
    request_timeout_s: float = 120.0
    max_duration_s: float = 3600.0
    max_consecutive_errors: int = 10


PlanItem = tuple[Case, Mode, int, bool]  # case, mode, position in the case's order, warm-up


def build_plan(cases: Sequence[Case], modes: Sequence[Mode], warmup: int) -> list[PlanItem]:
    """Every request of a run, in order: warm-ups first (`warmup` cases of each dataset source,
    so every mode is warmed on the kind of request it will serve), then each case in every mode
    that applies to its source, the order rotated from case to case."""
    plan: list[PlanItem] = []
    by_source: dict[str, list[Case]] = {}
    for case in cases:
        by_source.setdefault(case_source(case), []).append(case)
    for source, group in by_source.items():
        applicable = [m for m in modes if m.applies_to(source)]
        for i in range(warmup):
            case = group[i % len(group)]
            plan += [(case, m, p, True) for p, m in enumerate(mode_order(applicable, i))]
    for i, case in enumerate(cases):
        applicable = [m for m in modes if m.applies_to(case_source(case))]
        plan += [(case, m, p, False) for p, m in enumerate(mode_order(applicable, i))]
    return plan


def run_bench(
    client: Any,
    cases: Sequence[Case],
    modes: Sequence[Mode],
    settings: RequestSettings,
    warmup: int = 2,
    limits: RunLimits | None = None,
    progress: Callable[[Record], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[Record], str | None]:
    """Run every case in every mode, interleaved and rotated; return (records, stop reason).

    `client` is an `openai.OpenAI` (or anything with `.chat.completions.create(**kwargs)`).
    The stop reason is None when every request was sent.
    """
    limits = limits or RunLimits()
    records: list[Record] = []
    started = clock()
    consecutive_errors = 0
    plan = build_plan(cases, modes, warmup)

    stop_reason: str | None = None
    for case, mode, position, is_warmup in plan:
        if clock() - started > limits.max_duration_s:
            stop_reason = f"time budget of {limits.max_duration_s:.0f} s spent"
            break
        kwargs = build_request(case, mode, settings)
        t0 = clock()
        try:
            response = client.chat.completions.create(timeout=limits.request_timeout_s, **kwargs)
            record = record_from_response(
                response, case, mode.name, position, (clock() - t0) * 1000, is_warmup
            )
            consecutive_errors = 0
        except KeyboardInterrupt:
            stop_reason = "interrupted"  # keep (and report) what was measured so far
            break
        except Exception as exc:  # noqa: BLE001 - every failure becomes a record
            record = Record(case.id, case.category, mode.name, position, is_warmup,
                            error=describe_error(exc), e2e_ms=(clock() - t0) * 1000,
                            source=case_source(case),
                            conversation=getattr(case, "conversation", None),
                            call_index=getattr(case, "index", None))
            consecutive_errors += 1
            status = getattr(exc, "status_code", None)
            if is_warmup and isinstance(status, int) and 400 <= status < 500:
                # A mode the server cannot serve (e.g. no n-gram engine deployed) will not
                # start working halfway through: say so now instead of after N failures.
                records.append(record)
                stop_reason = f"the server rejected mode '{mode.name}': {record.error}"
                break
        records.append(record)
        if progress is not None:
            progress(record)
        if consecutive_errors >= limits.max_consecutive_errors:
            stop_reason = (
                f"{consecutive_errors} failed requests in a row; last: {record.error}"
            )
            break
    mark_identity(records)
    mark_agreement(records, cases)
    return records, stop_reason


# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's
    default); None for no values."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def median(values: Iterable[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return float(statistics.median(data)) if data else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def share(flags: Iterable[bool | None]) -> float | None:
    data = [bool(f) for f in flags if f is not None]
    return sum(data) / len(data) if data else None


def mode_summary(records: Sequence[Record]) -> dict[str, Any]:
    """Statistics of one mode's measured (non-warm-up) records."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    hits = [r for r in ok if r.outcome == "hit"]
    e2e = [r.e2e_ms for r in ok]
    total_steps = sum(r.steps or 0 for r in ok)
    # Calls the answers committed (the agent loop runs them on the server: its results).
    calls = sum(len(r.tool_calls) or len(r.tool_results) for r in ok)
    return {
        "n": len(ok),
        "errors": len(measured) - len(ok),
        "error_messages": dict(Counter(r.error for r in measured if r.error)),
        "hit_rate": len(hits) / len(ok) if ok else None,
        "outcomes": dict(Counter(r.outcome or "?" for r in ok).most_common()),
        "e2e_ms_p50": percentile(e2e, 50),
        "e2e_ms_p95": percentile(e2e, 95),
        "e2e_ms_mean": statistics.fmean(e2e) if e2e else None,
        "commit_ms_p50": percentile([r.first_commit_ms for r in ok
                                     if r.first_commit_ms is not None], 50),
        "tools_ms_median": median(r.tools_ms for r in ok if r.tool_results),
        "tool_results_pre_executed": share(t["speculative"] for r in ok for t in r.tool_results),
        "saved_ms_median": median(sum(t["saved_ms"] or 0.0 for t in r.tool_results)
                                  for r in ok if r.tool_results),
        "steps_median": median(r.steps for r in ok),
        # A forced call is the whole output: passes to the call, what a prediction races.
        "steps_median_with_call": median(r.steps for r in ok if r.tool_calls or r.tool_results),
        # `auto` mode: the model may answer in text; passes per committed call compare modes
        # whatever the mix.
        "with_call": share(bool(r.tool_calls or r.tool_results) for r in ok),
        "steps_per_call": total_steps / calls if calls else None,
        "steps_median_on_hits": median(r.steps for r in hits),
        "accepted_per_step": (
            sum(r.accepted_tokens or 0 for r in ok) / total_steps if total_steps else None
        ),
        "tokens_per_step": (
            sum(r.completion_tokens or 0 for r in ok) / total_steps if total_steps else None
        ),
        "decode_ms_median": median(r.decode_ms for r in ok),
        "first_commit_ms_median": median(r.first_commit_ms for r in ok),
        "ttft_ms_median": median(r.ttft_ms for r in ok),
        "sidecar_ms_median": median(r.sidecar_ms for r in ok if r.sidecar_ms),
        # Only requests that got a candidate before the main model finished have a ready
        # time, so read it together with the share that had one.
        "with_candidate": len([r for r in ok if r.candidates]) / len(ok) if ok else None,
        "candidate_ready_ms_median": median(r.candidate_ready_ms for r in ok),
        # Position in the case's rotated mode order: a gap between positions is the warm/cold
        # bias that the rotation cancels out of the overall numbers.
        "e2e_ms_median_by_position": {
            p: median(r.e2e_ms for r in ok if r.position == p)
            for p in sorted({r.position for r in ok})
        },
        "prediction_ready_ms_median": median(r.prediction_ready_ms for r in ok),
        "prediction_passes_median": median(r.prediction_passes for r in ok),
        "agreement_whole": share(r.agrees_whole for r in ok),
        "agreement_required": share(r.agrees_required for r in ok),
        "agreement_cases": len([r for r in ok if r.agrees_whole is not None]),
        "accuracy": share(r.correct for r in ok),
        "identical_to_plain": share(r.identical_to_plain for r in ok),
        "sources": source_totals(ok),
    }


def source_totals(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """Drafted, accepted and gained tokens per draft source, summed over the records (empty
    when none reported them)."""
    totals: dict[str, dict[str, int]] = {}
    for r in records:
        for name, tally in r.sources.items():
            into = totals.setdefault(name, {})
            for key, value in tally.items():
                into[key] = into.get(key, 0) + value
    return totals


def _paired(
    base: Mapping[str, Record], other: Sequence[Record], attr: str
) -> list[tuple[float, float]]:
    pairs = []
    for r in other:
        b = base.get(r.case_id)
        if b is None:
            continue
        x, y = getattr(b, attr), getattr(r, attr)
        if x is not None and y is not None:
            pairs.append((float(x), float(y)))
    return pairs


def paired_ratio_median(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Median over cases of baseline / mode (cases where the mode value is 0 are skipped)."""
    return median(b / m for b, m in pairs if m)


def versus_baseline(
    baseline: Sequence[Record], records: Sequence[Record]
) -> dict[str, Any]:
    """Speed-ups of one mode over the baseline: ratios are baseline / mode (>1 = faster)."""
    base = {r.case_id: r for r in baseline if r.ok and not r.warmup}
    ok = [r for r in records if r.ok and not r.warmup]
    hits = [r for r in ok if r.outcome == "hit"]
    base_decode = median(r.decode_ms for r in base.values())
    mode_decode = median(r.decode_ms for r in ok)
    ready = median(r.candidate_ready_ms for r in ok)
    hit_steps = _paired(base, hits, "steps")
    return {
        "steps_ratio": ratio(median(r.steps for r in base.values()), median(r.steps for r in ok)),
        "steps_ratio_on_hits": ratio(median(b for b, _ in hit_steps),
                                     median(m for _, m in hit_steps)),
        "steps_ratio_paired_median": paired_ratio_median(_paired(base, ok, "steps")),
        "decode_ratio": ratio(base_decode, mode_decode),
        "decode_ratio_paired_median": paired_ratio_median(_paired(base, ok, "decode_ms")),
        "e2e_ratio": ratio(median(r.e2e_ms for r in base.values()), median(r.e2e_ms for r in ok)),
        "e2e_ratio_paired_median": paired_ratio_median(_paired(base, ok, "e2e_ms")),
        "commit_ratio": ratio(median(r.first_commit_ms for r in base.values()),
                              median(r.first_commit_ms for r in ok)),
        "commit_ratio_paired_median": paired_ratio_median(_paired(base, ok, "first_commit_ms")),
        "candidate_ready_ms_median": ready,
        "plain_decode_ms_median": base_decode,
        "candidate_ready_vs_plain_decode": ratio(ready, base_decode),
        "paired_cases": len(_paired(base, ok, "e2e_ms")),
    }


def realign_effect(records: Sequence[Record], with_: str = "ooo",
                   without: str = "ooo:no-realign") -> dict[str, Any] | None:
    """Mean accepted tokens per main forward pass on the cases where `with_`'s candidate was
    only partly right (outcome `partial`), with re-alignment and without, same cases."""
    partial = {r.case_id for r in records
               if r.mode == with_ and r.ok and not r.warmup and r.outcome == "partial"}
    if not partial or not any(r.mode == without for r in records):
        return None

    def per_pass(mode: str) -> float | None:
        rates = [(r.accepted_tokens or 0) / r.steps for r in records
                 if r.mode == mode and r.ok and not r.warmup and r.case_id in partial
                 and r.steps]
        return statistics.fmean(rates) if rates else None

    return {"cases": len(partial), "accepted_per_pass_realign": per_pass(with_),
            "accepted_per_pass_no_realign": per_pass(without)}


def summarize(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Per-mode statistics, and every mode's ratios against `baseline` and against vLLM's own
    methods (`vs_plain`, `vs_ngram`, `vs_suffix`) when those modes ran."""
    by_mode = {m: [r for r in records if r.mode == m] for m in modes}
    summary: dict[str, Any] = {"modes": {m: mode_summary(rs) for m, rs in by_mode.items()}}
    summary["realign"] = realign_effect([r for rs in by_mode.values() for r in rs])
    for reference in dict.fromkeys([baseline, *PEERS]):
        if reference in by_mode:
            summary["vs_" + reference] = {
                m: versus_baseline(by_mode[reference], rs)
                for m, rs in by_mode.items()
                if m != reference
            }
    return summary


def summarize_by_source(
    records: Sequence[Record], modes: Sequence[Mode], baseline: str = BASELINE
) -> dict[str, dict[str, Any]]:
    """`summarize` per dataset source (BFCL and the agent set are different workloads), over
    the modes that run on it; multi-turn conversations also by position and per conversation
    (`multi_turn`)."""
    sources = list(dict.fromkeys(r.source for r in records))
    out: dict[str, dict[str, Any]] = {}
    for source in sources:
        mine = [r for r in records if r.source == source]
        names = [m.name for m in modes if m.applies_to(source)]
        out[source] = summarize(mine, names, baseline)
        if source == BFCL_MULTI:
            out[source]["multi_turn"] = multi_turn_summary(mine, names, baseline)
    return out


def multi_turn_summary(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Replayed conversations: `summarize` of the first calls and of the later calls apart (a
    first call meets a fresh schema; later ones repeat tools and copy earlier results), and
    per-conversation totals."""
    return {
        "first_calls": summarize([r for r in records if r.call_index == 0], modes, baseline),
        "later_calls": summarize([r for r in records if (r.call_index or 0) > 0], modes,
                                 baseline),
        "conversations": conversation_totals(records, modes, baseline),
    }


def conversation_totals(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Per mode, over the conversations it answered completely (every measured call ok, the
    same calls as the baseline's): main passes and end-to-end time summed per conversation
    (medians), the per-conversation ratios baseline / mode (median), and the share of
    conversations whose every call was identical to the baseline's."""
    measured = [r for r in records if not r.warmup and r.conversation is not None]

    def complete(mode: str) -> dict[str, list[Record]]:
        by_conv: dict[str, list[Record]] = {}
        for r in measured:
            if r.mode == mode:
                by_conv.setdefault(r.conversation or "", []).append(r)
        return {c: rs for c, rs in by_conv.items() if all(r.ok for r in rs)}

    base = complete(baseline) if baseline in modes else {}
    out: dict[str, Any] = {}
    for mode in modes:
        convs = complete(mode)
        paired = {c: rs for c, rs in convs.items()
                  if c in base and {r.case_id for r in rs} == {r.case_id for r in base[c]}}
        passes = {c: float(sum(r.steps or 0 for r in rs)) for c, rs in convs.items()}
        e2e = {c: sum(r.e2e_ms for r in rs) for c, rs in convs.items()}
        base_passes = {c: float(sum(r.steps or 0 for r in base[c])) for c in paired}
        base_e2e = {c: sum(r.e2e_ms for r in base[c]) for c in paired}
        out[mode] = {
            "conversations": len(convs),
            "calls": sum(len(rs) for rs in convs.values()),
            "passes_median": median(passes.values()),
            "e2e_ms_median": median(e2e.values()),
            "passes_ratio_paired_median": paired_ratio_median(
                [(base_passes[c], passes[c]) for c in paired]),
            "e2e_ratio_paired_median": paired_ratio_median(
                [(base_e2e[c], e2e[c]) for c in paired]),
            "identical_conversations": share(
                all(r.identical_to_plain for r in rs) for rs in paired.values()),
            "paired_conversations": len(paired),
        }
    return out


def records_as_dicts(records: Sequence[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]


# ---------------------------------------------------------------- the command


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreachable server): printed as one line."""


def _git_commit() -> str | None:
    import subprocess
    from pathlib import Path

    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id the server lists under /v1/models."""
    import httpx

    try:
        reply = httpx.get(f"{base_url}/v1/models", timeout=timeout_s)
        reply.raise_for_status()
        return str(reply.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(
            f"cannot list models at {base_url}/v1/models ({type(exc).__name__}: {exc}); "
            "is the server running? (or use --start)"
        ) from None


def suffix_refusal(modes: Sequence[Mode], starts_server: bool) -> str | None:
    """Why the `suffix` mode cannot run, when the bench starts the server here and vLLM's
    suffix decoding cannot start (arctic-inference missing); None when it can. A server the
    bench only talks to answers for itself (a 400 `baseline_not_deployed`, which stops the
    run in warm-up)."""
    from app.engine.vllm_suffix import SUFFIX_MISSING, suffix_available

    if not starts_server or SUFFIX not in {m.name for m in modes} or suffix_available():
        return None
    return f"mode {SUFFIX} refused: {SUFFIX_MISSING}; or leave {SUFFIX} out of --modes"


def run_command(args: Any, say: Callable[[str], None]) -> int:
    """The run behind `main`: see `build_parser` for the flags."""
    from datetime import datetime
    from pathlib import Path

    from load_tests import report

    try:
        modes = parse_modes(args.modes)
        specs = parse_dataset_spec(args.dataset)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if args.limit is not None and args.limit < 1:
        raise BenchError("--limit must be at least 1")
    if args.conversations is not None and args.conversations < 1:
        raise BenchError("--conversations must be at least 1")
    if args.warmup < 0:
        raise BenchError("--warmup must not be negative")
    # BFCL now (a bad category fails before any server starts); the agent set needs the
    # server's tool listing, so it loads once the server answers.
    cases: list[Case] = load_cases([s for s in specs if s.source not in AGENT_SOURCES],
                                   args.limit, conversations=args.conversations)
    wants_agent = any(s.source in AGENT_SOURCES for s in specs)
    if not cases and not wants_agent:
        raise BenchError(f"dataset {args.dataset} has no cases")
    unused = [m.name for m in modes
              if not any(m.applies_to(s.source) for s in specs)]
    if unused:
        raise BenchError(f"mode(s) {', '.join(unused)} run on none of these datasets "
                         f"(e.g. ooo+tools needs server-known tools: add the 'agent' set)")
    refusal = suffix_refusal(modes, bool(args.start))
    if refusal:
        raise BenchError(refusal)
    say(f"ooo-spec bench: datasets {', '.join(map(str, specs))}; "
        f"modes {', '.join(m.name for m in modes)}; warm-up {args.warmup} per mode and source")

    started_server = False
    try:
        if args.start:
            from deployments import local

            if args.slow_tool_ms is not None:
                from load_tests.bench_tools import SLOW_TOOL_ENV

                # Ray's workers (the tool worker among them) inherit the driver's environment.
                os.environ[SLOW_TOOL_ENV] = str(args.slow_tool_ms)
            config = local.load_serve_config(args.config)
            if args.port is not None:
                config.setdefault("http_options", {})["port"] = args.port
            say(f"ooo-spec bench: starting the app from {args.config} "
                f"on port {(config.get('http_options') or {}).get('port', 8000)} ...")
            t0 = time.monotonic()
            started_server = True
            base_url = local.start(config)
            say(f"ooo-spec bench: app ready in {time.monotonic() - t0:.0f} s at {base_url}")
        else:
            base_url = args.base_url or (
                f"http://127.0.0.1:{args.port}" if args.port is not None else DEFAULT_BASE_URL
            )
        base_url = base_url.rstrip("/")
        if base_url.endswith("/v1"):
            base_url = base_url[: -len("/v1")]
        model = args.model or served_model(base_url)
        if wants_agent:
            try:
                cases += load_cases([s for s in specs if s.source in AGENT_SOURCES], args.limit,
                                    server_tools=lambda: server_tool_listing(base_url))
            except ValueError as exc:
                raise BenchError(str(exc)) from None
        say(f"ooo-spec bench: {len(cases)} cases")
        records, stop_reason, elapsed = _measure(args, cases, modes, base_url, model)
    finally:
        if started_server:
            say("ooo-spec bench: stopping the app")
            from deployments import local

            local.stop()

    names = [m.name for m in modes]
    summaries = summarize_by_source(records, modes)
    print(format_header(args, base_url, model, len(cases), elapsed, stop_reason))
    for source, summary in summaries.items():
        if len(summaries) > 1:
            print(f"\n=== {source} ===\n")
        print(report.format_summary(summary, BASELINE, PEERS))
        if "multi_turn" in summary:
            print(report.format_multi_turn(summary["multi_turn"], BASELINE, PEERS))

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out)
    record_dicts = records_as_dicts(records)
    payload: dict[str, Any] = {
        "meta": {
            "dataset": args.dataset,
            "categories": [str(s) for s in specs],
            "limit": args.limit,
            "conversations": args.conversations,
            "modes": {m.name: dict(m.extra_body) for m in modes},
            "warmup": args.warmup,
            "base_url": base_url,
            "model": model,
            "started_server": bool(args.start),
            "config": args.config if args.start else None,
            "request": {"max_tokens": args.max_tokens, "temperature": 0.0,
                        "tool_choice": "required (auto on the bfcl-auto and agent-auto sets)",
                        "timeout_s": args.timeout,
                        "agent": "tool_choice and max_tokens per scenario, execute_tools"},
            "slow_tool_ms": args.slow_tool_ms if args.start else None,
            "cases": len(cases),
            "elapsed_s": elapsed,
            "stop_reason": stop_reason,
            "git_commit": _git_commit(),
            "finished_at": datetime.now().isoformat(timespec="seconds"),
        },
        "summary": summaries,  # per dataset source
        "records": record_dicts,
    }
    json_path = report.write_json(out_dir / f"bench-{stamp}.json", payload)
    print(f"\nrecords + summary: {json_path}")
    for source in summaries:
        suffix = f"-{source}" if len(summaries) > 1 else ""
        png_path = report.plot_latencies(
            out_dir / f"bench-{stamp}{suffix}.png",
            [r for r in record_dicts if r["source"] == source], names,
            title=f"{source}: {args.dataset} on {model}",
        )
        if png_path is not None:
            print(f"latency plot:      {png_path}")
    if stop_reason is not None:
        say(f"ooo-spec bench: stopped early: {stop_reason}")
        return 1
    return 0 if any(r.ok and not r.warmup for r in records) else 1


def modes_help() -> str:
    """The `--help` list of modes, from `MODES` (a registered mode shows up by itself)."""
    width = max(len(name) for name in MODES)
    lines = [f"modes (--modes, comma-separated; `{BASELINE}` is the baseline):"]
    for mode in MODES.values():
        only = f" [{', '.join(sorted(mode.sources))} only]" if mode.sources is not None else ""
        lines += _wrap(f"{mode.name:<{width}}  {mode.description}{only}", " " * (width + 4))
    return "\n".join(lines)


def _wrap(text: str, indent: str, first: str = "  ") -> list[str]:
    # Names hold hyphens (`bfcl-auto`): never split them.
    return textwrap.wrap(text, 96, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def datasets_help() -> str:
    """The `--help` list of datasets, from `DATASETS`, `BFCL_GROUPS` and `AUTO_SET`."""
    lines = _wrap("datasets (--dataset, comma-separated `source:category`; an item without a "
                  "source takes the one before it):", "  ", first="")
    for source in DATASETS.values():
        label = f"{source.name}:<category>" if source.categories else source.name
        lines += _wrap(f"{label}  {source.description}", "      ")
        if source.categories:
            lines += _wrap("categories: " + ", ".join(source.categories), "        ",
                           first="      ")
    shorthands = [f"bfcl:{name} = {', '.join(group)}" for name, group in BFCL_GROUPS.items()]
    shorthands.append(f"auto = {', '.join(AUTO_SET)}")
    lines += _wrap("shorthands: " + "; ".join(shorthands), "    ")
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults from the parser itself; the mode and dataset lists kept as laid out."""


def build_parser() -> argparse.ArgumentParser:
    """The CLI; its help lists every mode and dataset from the registries the code uses."""
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.bench",
        formatter_class=_HelpFormatter,
        description=textwrap.fill(
            "Send every case of a dataset once per mode to an OpenAI-compatible ooo-spec "
            "server (interleaved case by case, mode order rotated per case), then print "
            "per-mode statistics and ratios against `plain`, and write every request's numbers "
            "(JSON) and a latency plot (PNG) under --out. With --start the app is started from "
            "--config first and stopped at the end.", 96),
        epilog=f"{modes_help()}\n\n{datasets_help()}",
    )
    parser.add_argument("--dataset", default="bfcl:simple_python",
                        help="comma-separated datasets (listed below)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N cases of each category, or N conversations of a "
                        "bfcl-multi category (None: all)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="first N conversations of each bfcl-multi category (None: "
                        "--limit)")
    parser.add_argument("--modes", default="plain,ooo",
                        help="comma-separated modes (listed below); `ngram` and `suffix` need "
                        "their engines on the server (configs/bench.yaml)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="warm-up requests per mode, left out of the statistics")
    parser.add_argument("--base-url", default=None,
                        help=f"server to benchmark (None: {DEFAULT_BASE_URL}, or the port of "
                        "--port); ignored with --start")
    parser.add_argument("--start", action="store_true",
                        help="start the app from --config (local Ray) and stop it at the end")
    parser.add_argument("--config", default="configs/local.yaml",
                        help="Ray Serve config file for --start")
    parser.add_argument("--port", type=int, default=None,
                        help="HTTP port: overrides the config's port with --start, else the "
                        "port of the default base URL")
    parser.add_argument("--model", default=None,
                        help="model name to send (None: the first one in /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="per-request timeout in seconds")
    parser.add_argument("--max-duration", type=float, default=3600.0,
                        help="stop sending requests after this many seconds")
    parser.add_argument("--max-errors", type=int, default=10,
                        help="stop after this many failed requests in a row")
    parser.add_argument("--slow-tool-ms", type=float, default=None,
                        help="with --start: latency of the bench tool slow_lookup "
                        "(load_tests/bench_tools.py, OOO_SPEC_SLOW_TOOL_MS; None: its own 500)")
    parser.add_argument("--out", default="bench_out/",
                        help="folder for the JSON records and the PNG plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m load_tests.bench` (and `ooo-spec bench`, which runs it): the exit code."""
    args = build_parser().parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        return run_command(args, say)
    except BenchError as error:
        print(f"bench: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


def format_header(
    args: Any, base_url: str, model: str, cases: int, elapsed: float, stop: str | None
) -> str:
    line = (f"\nooo-spec bench  dataset={args.dataset} cases={cases} warmup={args.warmup}/mode "
            f"server={base_url} model={model} elapsed={elapsed:.0f}s")
    if stop:
        line += f"  STOPPED EARLY: {stop}"
    return line + "\n"


def server_tool_listing(base_url: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The `data` of `GET /v1/tools`."""
    import httpx

    try:
        reply = httpx.get(f"{base_url}/v1/tools", timeout=timeout_s)
        reply.raise_for_status()
        return list(reply.json()["data"])
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise BenchError(
            f"cannot list the server's tools at {base_url}/v1/tools ({type(exc).__name__}: "
            f"{exc}); the agent set needs them"
        ) from None


def _measure(
    args: Any, cases: Sequence[Case], modes: Sequence[Mode], base_url: str, model: str
) -> tuple[list[Record], str | None, float]:
    from openai import OpenAI
    from tqdm import tqdm

    client = OpenAI(base_url=f"{base_url}/v1", api_key="ooo-spec-bench", max_retries=0,
                    timeout=args.timeout)
    total = len(build_plan(cases, modes, args.warmup))
    bar = tqdm(total=total, file=sys.stderr, unit="req", dynamic_ncols=True,
               disable=args.no_progress)
    failures = Counter[str]()
    outcomes = Counter[str]()

    def progress(record: Record) -> None:
        if record.error:
            failures[record.mode] += 1
        elif not record.warmup and record.mode != BASELINE:
            outcomes[record.outcome or "?"] += 1
        postfix: dict[str, Any] = {"case": record.case_id, "mode": record.mode,
                   "ms": f"{record.e2e_ms:.0f}"}
        if outcomes:
            postfix["outcomes"] = " ".join(f"{k}:{v}" for k, v in outcomes.most_common())
        if failures:
            postfix["errors"] = sum(failures.values())
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)

    t0 = time.monotonic()
    try:
        records, stop_reason = run_bench(
            client, cases, modes, RequestSettings(model=model, max_tokens=args.max_tokens),
            warmup=args.warmup,
            limits=RunLimits(request_timeout_s=args.timeout, max_duration_s=args.max_duration,
                             max_consecutive_errors=args.max_errors),
            progress=progress,
        )
    finally:
        bar.close()
        client.close()
    return records, stop_reason, time.monotonic() - t0


if __name__ == "__main__":
    sys.exit(main())
