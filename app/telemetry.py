"""OpenTelemetry traces and the metric catalogue of ooo-spec.

Traces. `setup_tracing(component)` configures this process from the standard `OTEL_*`
environment: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL`
(`http/protobuf`, the default, or `grpc`), `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER[_ARG]` and the batch processor's `OTEL_BSP_*`. Without an endpoint (or
with `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`) tracing stays off: every helper
below returns at once and nothing is allocated or sent.

One request is one trace. The router's `router.request` is its root, always in a trace of its
own that this process's sampler decides on (a client's W3C `traceparent` becomes a link, so a
client can neither force sampling nor join the server's spans to its trace); `agent.turn` spans
hold each main-model turn with `sidecar.predict`, `main.generate` (and its
`candidate.validate`), `tool.execute`, `reconcile` and `agent.tools` below them. Context crosses
Ray explicitly: the caller `inject`s a `traceparent` carrier into the handle call (the chat
payload's `CARRIER_KEY`, or a keyword for the tool worker) and the replica `extract`s it. Ray
Serve 2.60 has a tracing hook of its own, but it sits in `ray.serve._private`, installs the
global tracer provider with its own sampler (a ratio, 1% by default, not `OTEL_TRACES_SAMPLER`)
and roots every trace at the HTTP proxy with spans of its own; explicit carriers keep the trace
shape and its configuration ours.

Async generators never hold a span *current* across a `yield` (the context would leak into the
consumer, and a generator finalised by another task cannot detach it): they use `start_span`
and pass contexts on explicitly; `span` (current, for work and tasks started inside it) is
for blocks without a `yield`.

Privacy: span attributes carry counts, names of tools, outcomes and timings. Message text, tool
arguments and tool results can be personal data; they are recorded only with
`telemetry.record_content: true` in the app config.

Metrics. `METRICS` lists every metric with its kind, tags and buckets. The library reports
`Measurement`s to a `MetricsSink`; the deployments bind it to `ray.serve.metrics`, which Ray
exports on its Prometheus endpoint as `ray_<name>` (counters with `_total`), so `app/` stays free
of Ray Serve.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.speculation.draft_sources import DRAFT_SOURCES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from app.openai_models import OooSpecReport
    from app.speculation.prediction import Prediction
    from app.speculation.turn import TurnResult

TRACER_NAME = "ooo_spec"
DEFAULT_SERVICE_NAME = "ooo-spec"
# Where the chat payload carries the trace context to the sidecar and main replicas (popped
# there before the payload is validated as a request).
CARRIER_KEY = "_trace_context"

Carrier = dict[str, str]
ExportProtocol = Literal["grpc", "http/protobuf"]

_PROPAGATOR = TraceContextTextMapPropagator()
_lock = threading.Lock()
_tracer: Tracer | None = None  # None: tracing is off in this process


# ----- setup ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceSettings:
    protocol: ExportProtocol
    endpoint: str


def trace_settings(environ: Mapping[str, str]) -> TraceSettings | None:
    """What the `OTEL_*` environment asks for; None means tracing off. A value ooo-spec cannot
    honour is a ValueError (the replica fails to start with the message, never exports
    silently nowhere)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={exporter!r}: ooo-spec exports traces with 'otlp' (or 'none')"
        )
    endpoint = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or ""
    ).strip()
    if not endpoint:
        return None
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip().lower()
    if protocol == "grpc":
        return TraceSettings("grpc", endpoint)
    if protocol == "http/protobuf":
        return TraceSettings("http/protobuf", endpoint)
    raise ValueError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: ooo-spec exports traces over "
        "'http/protobuf' or 'grpc'"
    )


def setup_tracing(component: str) -> bool:
    """Configure tracing for this process from `os.environ` (once); True when it is on.

    `component` ('router', 'main', 'sidecar', 'tool_worker') goes on the resource beside the
    process id, so a trace shows which replica process each span came from."""
    with _lock:
        if _tracer is not None:
            return True
        settings = trace_settings(os.environ)
        if settings is None:
            return False
        # The SDK and exporters are imported only when tracing is on.
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({
            "ooo_spec.component": component,
            "process.pid": os.getpid(),
            "host.name": socket.gethostname(),
        })
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        # No sampler argument: the SDK reads OTEL_TRACES_SAMPLER (default parentbased_always_on,
        # so replicas follow the router's decision carried in `traceparent`).
        provider = TracerProvider(resource=resource, id_generator=SystemRandomIdGenerator())
        # The exporters read endpoint, headers, timeout and compression from the environment;
        # BatchSpanProcessor reads OTEL_BSP_SCHEDULE_DELAY and friends.
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings.protocol)))
        _install(provider)
        return True


class SystemRandomIdGenerator(IdGenerator):
    """Trace and span ids from the OS's randomness. The SDK's default draws from the global
    `random` module, which vLLM (and other libraries) seed with a fixed value in every process,
    so replicas would hand out the same span ids (seen: the same id in router and main)."""

    _random = random.SystemRandom()

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


def _exporter(protocol: ExportProtocol) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def _install(provider: TracerProvider) -> None:
    global _tracer
    _tracer = provider.get_tracer(TRACER_NAME)


def use_provider(provider: TracerProvider | None) -> None:
    """Trace through `provider` (tests: an in-memory exporter); None turns tracing off."""
    global _tracer
    with _lock:
        _tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


# ----- spans and context --------------------------------------------------------------------
def start_span(
    name: str,
    parent: Context | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Span:
    """A span that is not made current; the caller ends it. `parent` None: the current span."""
    if _tracer is None:
        return trace.INVALID_SPAN
    return _tracer.start_span(name, context=parent, kind=kind, attributes=_clean(attributes))


def start_root_span(
    name: str,
    linked: Context | None = None,
    kind: SpanKind = SpanKind.SERVER,
) -> Span:
    """The first span of a new trace, whatever the current context: this process's root
    sampler decides whether it is recorded. `linked` (a client's `traceparent`) becomes a link,
    never the parent, so a client can neither turn sampling on for its requests (its sampled
    flag) nor graft the server's spans into a trace of its choosing."""
    if _tracer is None:
        return trace.INVALID_SPAN
    links = []
    if linked is not None:
        client = trace.get_current_span(linked).get_span_context()
        if client.is_valid:
            links.append(trace.Link(client))
    return _tracer.start_span(name, context=Context(), kind=kind, links=links)


@contextmanager
def span(
    name: str, parent: Context | None = None, attributes: Mapping[str, Any] | None = None
) -> Iterator[Span]:
    """A current span around a block with no `yield` in it: spans, carriers and tasks created
    inside are its children. An exception marks it failed (by type only) and propagates."""
    if _tracer is None:
        yield trace.INVALID_SPAN
        return
    with _tracer.start_as_current_span(
        name, context=parent, attributes=_clean(attributes),
        record_exception=False, set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            fail(current, exc)
            raise


def within(current: Span) -> AbstractContextManager[Any]:
    """Make an already started span current for a block with no `yield` in it."""
    if _tracer is None:
        return nullcontext()
    return trace.use_span(current, end_on_exit=False)


def context_of(current: Span) -> Context | None:
    """The context whose parent is `current`, for spans started elsewhere."""
    if _tracer is None:
        return None
    return trace.set_span_in_context(current)


def fail(current: Span, exc: BaseException) -> None:
    """Record how a span ended abnormally. Only the exception's type: messages can quote the
    request (a validation error names the offending value)."""
    if not current.is_recording():
        return
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        current.set_attribute("ooo_spec.cancelled", True)
        return
    current.set_attribute("error.type", type(exc).__name__)
    current.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def inject(context: Context | None = None) -> Carrier | None:
    """The W3C carrier (`traceparent`, `tracestate`) of `context` (None: the current one), or
    None when tracing is off or there is no span to continue."""
    if _tracer is None:
        return None
    carrier: Carrier = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier or None


def extract(carrier: Mapping[str, str] | None) -> Context | None:
    """The parent context a carrier (or HTTP headers) describes; None when tracing is off or
    the carrier holds none. A malformed `traceparent` starts a new trace."""
    if _tracer is None or not carrier:
        return None
    return _PROPAGATOR.extract(carrier)


def set_attributes(current: Span, attributes: Mapping[str, Any]) -> None:
    if current.is_recording():
        current.set_attributes(_clean(attributes) or {})


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    # OTel rejects None values (with a warning per value).
    if attributes is None:
        return None
    return {k: v for k, v in attributes.items() if v is not None}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


# ----- span attributes (pure) --------------------------------------------------------------
def request_attributes(report: OooSpecReport, turns: int) -> dict[str, Any]:
    """`router.request`: what the whole request did (never its content)."""
    saved = sum(r.saved_ms for r in report.tool_results)
    return {
        "ooo_spec.enabled": report.enabled,
        "ooo_spec.outcome": report.outcome,
        "ooo_spec.turns": turns,
        "ooo_spec.main.steps": report.main.steps,
        "ooo_spec.main.completion_tokens": report.main.completion_tokens,
        "ooo_spec.main.drafted_tokens": report.main.drafted_tokens,
        "ooo_spec.main.accepted_tokens": report.main.accepted_tokens,
        "ooo_spec.tools.count": len(report.tool_results),
        "ooo_spec.tools.speculative": sum(r.speculative for r in report.tool_results),
        "ooo_spec.tools.saved_ms": saved,
        "ooo_spec.timings.total_ms": report.timings_ms.total,
    }


def turn_attributes(
    index: int, tool_choice: str, outcome: str, calls: Iterable[str]
) -> dict[str, Any]:
    """`agent.turn`: the turn's place in the loop and the names of the calls it committed."""
    names = list(calls)
    return {
        "ooo_spec.turn": index,
        "ooo_spec.tool_choice": tool_choice,
        "ooo_spec.outcome": outcome,
        "ooo_spec.calls": len(names),
        "gen_ai.tool.names": names,
    }


def prediction_status(prediction: Prediction) -> str:
    """'ok', 'no_call' or 'error' ('cancelled' is the sidecar call's, when the router stops
    waiting: the main model finished first)."""
    return "error" if prediction.error else "no_call" if prediction.no_call else "ok"


def prediction_attributes(prediction: Prediction, record_content: bool) -> dict[str, Any]:
    """`sidecar.predict`."""
    status = prediction_status(prediction)
    names = sorted({c.name for group in prediction.candidates for c in group})
    out: dict[str, Any] = {
        "ooo_spec.sidecar.status": status,
        "ooo_spec.sidecar.candidates": len(prediction.candidates),
        "ooo_spec.sidecar.elapsed_ms": prediction.elapsed_ms,
        "gen_ai.tool.names": names,
    }
    if record_content:
        out["ooo_spec.sidecar.prediction"] = _json(
            [[c.model_dump() for c in group] for group in prediction.candidates]
        )
        out["ooo_spec.sidecar.error"] = prediction.error
    return out


def validation_attributes(
    status: str, reports: Iterable[Any], rendered: int, record_content: bool
) -> dict[str, Any]:
    """`candidate.validate`: `reports` are `CandidateReport`s (name, arguments, valid)."""
    items = list(reports)
    out: dict[str, Any] = {
        "ooo_spec.candidate.status": status,
        "ooo_spec.candidate.calls": len(items),
        "ooo_spec.candidate.valid": sum(1 for r in items if r.valid),
        "ooo_spec.candidate.rendered": rendered,
        "gen_ai.tool.names": sorted({r.name for r in items}),
    }
    if record_content:
        out["ooo_spec.candidate.arguments"] = _json([r.arguments for r in items])
    return out


def main_attributes(final: TurnResult, record_content: bool) -> dict[str, Any]:
    """`main.generate`, from the main replica's result."""
    main = final.main
    out: dict[str, Any] = {
        "ooo_spec.main.steps": main.steps,
        "ooo_spec.main.completion_tokens": main.completion_tokens,
        "ooo_spec.main.drafted_tokens": main.drafted_tokens,
        "ooo_spec.main.accepted_tokens": main.accepted_tokens,
        "ooo_spec.main.ttft_ms": main.ttft_ms,
        "ooo_spec.main.decode_ms": main.decode_ms,
        "gen_ai.usage.input_tokens": final.prompt_tokens,
        "gen_ai.usage.output_tokens": final.completion_tokens,
        "gen_ai.response.finish_reasons": [final.finish_reason or "stop"],
        "ooo_spec.sidecar.status": final.sidecar.status,
        "ooo_spec.calls": len(final.calls),
        "gen_ai.tool.names": [c.name for c in final.calls],
    }
    if record_content:
        out["ooo_spec.main.text"] = final.text
        out["ooo_spec.main.arguments"] = _json([c.arguments for c in final.calls])
    return out


def tool_attributes(
    name: str,
    speculative: bool,
    result: Mapping[str, Any] | None,
    arguments: Mapping[str, Any],
    record_content: bool,
) -> dict[str, Any]:
    """`tool.execute`, in the tool worker; `result` is a `ToolResult` dict."""
    out: dict[str, Any] = {"gen_ai.tool.name": name, "ooo_spec.tool.speculative": speculative}
    if result is not None:
        out["ooo_spec.tool.is_error"] = bool(result.get("is_error"))
        out["ooo_spec.tool.latency_ms"] = float(result.get("latency_ms") or 0.0)
    if record_content:
        out["gen_ai.tool.call.arguments"] = _json(dict(arguments))
        if result is not None:
            out["gen_ai.tool.call.result"] = result.get("content")
    return out


def reconcile_attributes(
    outcome: str, dispatched: int, used: int, saved_ms: float
) -> dict[str, Any]:
    """`reconcile`: the prediction's outcome and what pre-execution gave this turn."""
    return {
        "ooo_spec.outcome": outcome,
        "ooo_spec.pre_executions": dispatched,
        "ooo_spec.pre_executions.used": used,
        "ooo_spec.pre_executions.wasted": max(0, dispatched - used),
        "ooo_spec.tools.saved_ms": saved_ms,
    }


# ----- metrics ------------------------------------------------------------------------------
MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: MetricKind
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()


MS_BUCKETS = (5.0, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
STEP_BUCKETS = (1.0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

REQUESTS = MetricSpec(
    "ooo_spec_requests", "counter",
    "Chat completions by outcome: hit, partial, miss, no_call, disabled, sidecar_error, "
    "sidecar_late, sidecar_skipped (not worth calling lately), or error (the request failed).",
    ("outcome",),
)
HIT_RATE = MetricSpec(
    "ooo_spec_hit_rate", "gauge",
    "Share of hits among the last speculated requests that committed a tool call, per router "
    "replica (telemetry.hit_rate_window requests).",
)
DRAFTED_TOKENS = MetricSpec(
    "ooo_spec_drafted_tokens", "counter",
    "Draft tokens the main model verified (candidate, schema or prompt-lookup drafts).",
    ("speculative",),
)
ACCEPTED_TOKENS = MetricSpec(
    "ooo_spec_accepted_tokens", "counter", "Draft tokens the main model accepted.",
    ("speculative",),
)
MAIN_STEPS = MetricSpec(
    "ooo_spec_main_steps", "histogram",
    "Main-model forward passes per main call (one turn of one request).",
    ("speculative",), STEP_BUCKETS,
)
SIDECAR_LATENCY = MetricSpec(
    "ooo_spec_sidecar_latency_ms", "histogram",
    "Time the sidecar took for one prediction, by status (ok, no_call, error; cancelled: the "
    "time until the router stopped waiting because the main model had finished).",
    ("status",), MS_BUCKETS,
)
TOOL_LATENCY = MetricSpec(
    "ooo_spec_tool_latency_ms", "histogram",
    "Execution time of one tool call in the tool worker, by tool and speculative (pre-executed).",
    ("tool", "speculative"), MS_BUCKETS,
)
TOOL_SAVED = MetricSpec(
    "ooo_spec_tool_saved_ms", "histogram",
    "Tool time hidden behind decoding by a pre-executed result the response used.",
    ("tool",), MS_BUCKETS,
)
PRE_EXECUTIONS = MetricSpec(
    "ooo_spec_pre_executions", "counter",
    "Speculative pre-executions by result: used (answered a committed call) or wasted "
    "(mispredicted, or not finished when the answer was due).",
    ("result",),
)
SOURCE_DRAFTED = MetricSpec(
    "ooo_spec_source_drafted_tokens", "counter",
    "Draft tokens the main model verified, by the source that drafted them: sidecar, history, "
    "schema, suffix or lookup (app/speculation/draft_sources.py).",
    ("source",),
)
SOURCE_ACCEPTED = MetricSpec(
    "ooo_spec_source_accepted_tokens", "counter",
    "Draft tokens the main model accepted, by the source that drafted them.",
    ("source",),
)
SOURCE_GAIN = MetricSpec(
    "ooo_spec_source_gain_tokens", "counter",
    "Accepted draft tokens beyond what the best other source's draft at the same steps would "
    "have had accepted, by source; a request where another source would have done better "
    "adds nothing (its `ooo_spec.main.sources` shows the negative gain). The sidecar's "
    "decides whether it is called (app/api/sidecar_value.py).",
    ("source",),
)
SIDECAR_DECISIONS = MetricSpec(
    "ooo_spec_sidecar_decisions", "counter",
    "Turns that wanted the sidecar, by whether they called it and why (app/api/"
    "sidecar_value.py): always, measuring, pays, does_not_pay, probe, pre_execution, "
    "diagnostics.",
    ("call", "reason"),
)
ROUTING_DECISIONS = MetricSpec(
    "ooo_spec_routing_decisions", "counter",
    "Requests a Router replica sent to the MainModel or Sidecar deployment under cache-affinity "
    "routing (deployments/prefix_router.py), by target deployment and why the replica was "
    "chosen: affinity (it holds the tenant's longest prompt prefix), no_match, short_match or "
    "imbalanced (power of two choices decided).",
    ("target", "reason"),
)
PROMPT_TOKENS = MetricSpec(
    "ooo_spec_prompt_tokens", "counter",
    "Prompt tokens a MainModel or Sidecar engine prefilled, by whether vLLM's prefix cache "
    "served them (cached=true) or they were computed (cached=false); Serve's own `deployment` "
    "tag splits them per deployment: the prefix cache hit rate that cache-affinity routing "
    "keeps up.",
    ("cached",),
)
METRICS: tuple[MetricSpec, ...] = (
    REQUESTS, HIT_RATE, DRAFTED_TOKENS, ACCEPTED_TOKENS, MAIN_STEPS, SIDECAR_LATENCY,
    TOOL_LATENCY, TOOL_SAVED, PRE_EXECUTIONS, SOURCE_DRAFTED, SOURCE_ACCEPTED, SOURCE_GAIN,
    SIDECAR_DECISIONS, ROUTING_DECISIONS, PROMPT_TOKENS,
)


@dataclass(frozen=True)
class Measurement:
    metric: MetricSpec
    value: float
    tags: Mapping[str, str]


class MetricsSink(Protocol):
    def record(self, measurement: Measurement) -> None:
        """Count (counter), set (gauge) or observe (histogram) one value; never raises."""
        ...


class NullMetrics:
    def record(self, measurement: Measurement) -> None:
        return None


def record_all(sink: MetricsSink, measurements: Iterable[Measurement]) -> None:
    for measurement in measurements:
        # A counter only takes positive increments (Ray refuses 0).
        if measurement.metric.kind == "counter" and measurement.value <= 0:
            continue
        sink.record(measurement)


def _flag(value: bool) -> str:
    return "true" if value else "false"


# Outcomes where a prediction could have matched a committed call: the hit rate's denominator.
_SCORED = frozenset({"hit", "partial", "miss", "sidecar_late", "sidecar_error"})


class HitRateWindow:
    """Hits among the last `size` scored requests (a speculated request that committed a call:
    a late or failed sidecar counts as a miss, `no_call` and `disabled` do not count)."""

    def __init__(self, size: int) -> None:
        self._window: deque[bool] = deque(maxlen=size)

    def add(self, outcome: str) -> float | None:
        """Take one request's outcome; the rate after it, or None if it was not scored."""
        if outcome not in _SCORED:
            return None
        self._window.append(outcome == "hit")
        return sum(self._window) / len(self._window)


def request_measurements(
    report: OooSpecReport, pre_executed: int, pre_used: int, hit_rate: float | None
) -> list[Measurement]:
    """What the router records when a request has completed."""
    out = [Measurement(REQUESTS, 1, {"outcome": report.outcome})]
    if hit_rate is not None:
        out.append(Measurement(HIT_RATE, hit_rate, {}))
    for result in report.tool_results:
        if result.speculative:
            out.append(Measurement(TOOL_SAVED, result.saved_ms, {"tool": result.name}))
    out.append(Measurement(PRE_EXECUTIONS, pre_used, {"result": "used"}))
    out.append(Measurement(PRE_EXECUTIONS, max(0, pre_executed - pre_used), {"result": "wasted"}))
    for source in DRAFT_SOURCES:
        tally = report.main.sources.of(source)
        if tally.drafted_tokens:
            tags = {"source": source}
            out.append(Measurement(SOURCE_DRAFTED, tally.drafted_tokens, tags))
            out.append(Measurement(SOURCE_ACCEPTED, tally.accepted_tokens, tags))
            out.append(Measurement(SOURCE_GAIN, tally.gain_tokens, tags))
    for decision in report.sidecar_decisions:
        out.append(Measurement(SIDECAR_DECISIONS, 1,
                               {"call": _flag(decision.call), "reason": decision.reason}))
    return out


def failed_request_measurements() -> list[Measurement]:
    return [Measurement(REQUESTS, 1, {"outcome": "error"})]


def main_measurements(final: TurnResult, speculative: bool) -> list[Measurement]:
    """What the main replica records per main call, from its result."""
    tags = {"speculative": _flag(speculative)}
    return [
        Measurement(MAIN_STEPS, float(final.main.steps), tags),
        Measurement(DRAFTED_TOKENS, float(final.main.drafted_tokens), tags),
        Measurement(ACCEPTED_TOKENS, float(final.main.accepted_tokens), tags),
    ]


def routing_measurements(target: str, reason: str) -> list[Measurement]:
    return [Measurement(ROUTING_DECISIONS, 1, {"target": target, "reason": reason})]


def prefill_measurements(prompt_tokens: int, cached_tokens: int) -> list[Measurement]:
    """An engine's prefilled prompt tokens since the last count, split by the prefix cache
    (Serve tags the deployment itself)."""
    if prompt_tokens <= 0:
        return []
    return [
        Measurement(PROMPT_TOKENS, float(cached_tokens), {"cached": "true"}),
        Measurement(PROMPT_TOKENS, float(prompt_tokens - cached_tokens), {"cached": "false"}),
    ]


def sidecar_measurements(status: str, elapsed_ms: float) -> list[Measurement]:
    return [Measurement(SIDECAR_LATENCY, elapsed_ms, {"status": status})]


def tool_measurements(name: str, speculative: bool, latency_ms: float) -> list[Measurement]:
    return [Measurement(TOOL_LATENCY, latency_ms,
                        {"tool": name, "speculative": _flag(speculative)})]
