"""app.telemetry: OTEL_* settings, the no-op path, the trace shape ChatService produces (with
an in-memory exporter and the agent-loop fakes), span attributes without content, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app import telemetry
from app.api.chat_service import ChatService
from app.api.errors import ApiError
from app.config import TelemetryConfig, load_config
from app.openai_models import OooSpecReport
from app.speculation.prediction import Prediction
from app.speculation.turn import TurnError
from app.telemetry import (
    PRE_EXECUTIONS,
    REQUESTS,
    TOOL_SAVED,
    HitRateWindow,
    Measurement,
    trace_settings,
)
from app.tools.registry import ToolResult
from tests.unit.test_agent_loop import FakePool, ManualClock, Script, final, lookup, request

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SECRET = "value-nobody-may-see"


# ----- settings -----------------------------------------------------------------------------
def test_no_endpoint_means_off() -> None:
    assert trace_settings({}) is None
    assert trace_settings({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None


def test_endpoint_turns_tracing_on_with_http_protobuf_by_default() -> None:
    settings = trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert settings is not None and settings.protocol == "http/protobuf"
    grpc = trace_settings({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317",
                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc is not None and grpc.protocol == "grpc"
    assert grpc.endpoint == "http://127.0.0.1:4317"
    # The per-signal protocol wins over the general one.
    traces = trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4317",
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert traces is not None and traces.protocol == "grpc"


@pytest.mark.parametrize("switch", [{"OTEL_SDK_DISABLED": "true"},
                                    {"OTEL_TRACES_EXPORTER": "none"}])
def test_standard_switches_turn_tracing_off(switch: dict[str, str]) -> None:
    assert trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", **switch}) is None


@pytest.mark.parametrize("env, message", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
])
def test_unsupported_settings_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", **env})


def test_setup_without_endpoint_leaves_every_helper_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    telemetry.use_provider(None)
    assert telemetry.setup_tracing("router") is False
    assert not telemetry.enabled()
    span = telemetry.start_span("x")
    assert not span.is_recording()
    with telemetry.span("y") as inner:
        assert not inner.is_recording()
        assert telemetry.inject() is None
    assert telemetry.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}) is None
    assert telemetry.context_of(span) is None


def test_setup_with_endpoint_installs_an_exporting_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    telemetry.use_provider(None)
    try:
        assert telemetry.setup_tracing("sidecar") is True
        assert telemetry.setup_tracing("sidecar") is True  # once per process
        span = telemetry.start_span("x")
        assert span.is_recording()
        resource = span.resource  # type: ignore[attr-defined]
        assert resource.attributes["service.name"] == "ooo-spec"
        assert resource.attributes["ooo_spec.component"] == "sidecar"
        assert isinstance(resource.attributes["process.pid"], int)
    finally:
        telemetry.use_provider(None)


def test_the_root_sampler_decides_not_the_clients_sampled_flag() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_provider(provider)
    try:
        sampled = telemetry.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        root = telemetry.start_root_span("router.request", sampled)
        assert not root.is_recording()  # the client asked for sampling; the server said no
        root.end()
        # Sampled by the server, a client's unsampled flag does not turn it off either.
        telemetry.use_provider(None)
        on = TracerProvider()
        on.add_span_processor(SimpleSpanProcessor(exporter))
        telemetry.use_provider(on)
        unsampled = telemetry.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
        other = telemetry.start_root_span("router.request", unsampled)
        assert other.is_recording()
        other.end()
    finally:
        telemetry.use_provider(None)


# ----- traces through ChatService -----------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.use_provider(None)


class TracedPool(FakePool):
    """FakePool that keeps the carrier each call would send to the tool worker."""

    def __init__(self, lookup_s: float, clock: ManualClock | None = None,
                 hold: asyncio.Event | None = None) -> None:
        super().__init__(lookup_s, clock, hold)
        self.carriers: list[tuple[bool, dict[str, str] | None]] = []

    async def execute(self, name: str, arguments: dict[str, Any], speculative: bool,
                      tenant: str = "anonymous") -> ToolResult:
        self.carriers.append((speculative, telemetry.inject()))
        return await super().execute(name, arguments, speculative, tenant)


class RecordingSink:
    def __init__(self) -> None:
        self.measurements: list[Measurement] = []

    def record(self, measurement: Measurement) -> None:
        self.measurements.append(measurement)

    def total(self, name: str, **tags: str) -> float:
        return sum(m.value for m in self.measurements
                   if m.metric.name == name and all(m.tags.get(k) == v for k, v in tags.items()))


def parent_of(carrier: dict[str, str] | None) -> int:
    assert carrier is not None
    return int(carrier["traceparent"].split("-")[2], 16)


def by_name(exported: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exported:
        out.setdefault(span.name, []).append(span)
    return out


async def run(service: ChatService, script: Script, execute_tools: bool = True) -> dict[str, Any]:
    client = telemetry.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    result: dict[str, Any] | None = None
    async for kind, event in service.events(request(execute_tools=execute_tools),
                                            script.start_sidecar, script.main_events,
                                            trace_parent=client):
        if kind == "final":
            result = event
    assert result is not None
    return result


async def test_one_request_is_one_trace_with_the_loop_below_the_root(
    spans: InMemorySpanExporter,
) -> None:
    """A misprediction under execute_tools: the speculative run belongs to the turn, the
    committed run to `agent.tools`, and the sidecar/main calls carry the turn's context."""
    clock = ManualClock()
    # The speculative run is in flight until cancelled, and dispatched before the commit.
    pool = TracedPool(lookup_s=0.3, clock=clock, hold=asyncio.Event())
    script = Script([final([lookup("b")]), final([], content="ok")],
                    predictions=[[lookup("a")]], decode_s=0.05, commit_after=pool.speculated,
                    clock=clock)
    sink = RecordingSink()
    service = ChatService("m", True, pool, metrics=sink, clock=clock)
    out = await asyncio.wait_for(run(service, script), 30)
    await asyncio.wait_for(pool.cancelled_run.wait(), 30)  # the misprediction was stopped

    exported = spans.get_finished_spans()
    names = by_name(exported)
    [root] = names["router.request"]
    # A trace of the server's own, linked to the client's span (never its child).
    assert {s.context.trace_id for s in exported} == {root.context.trace_id}
    assert root.context.trace_id != int(CLIENT_TRACE, 16) and root.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in root.links] == [
        (int(CLIENT_TRACE, 16), int(CLIENT_SPAN, 16))]
    assert root.attributes is not None
    assert root.attributes["ooo_spec.outcome"] == out["ooo_spec"]["outcome"]
    assert root.attributes["ooo_spec.turns"] == 2
    turns = sorted(names["agent.turn"], key=lambda s: s.start_time or 0)
    assert [t.attributes["ooo_spec.turn"] for t in turns if t.attributes] == [0, 1]
    assert all(t.parent is not None and t.parent.span_id == root.context.span_id for t in turns)
    first, second = (t.context.span_id for t in turns)

    # One reconcile per turn; the first turn's accounts for the wasted speculative run.
    reconciles = {r.parent.span_id: r for r in names["reconcile"] if r.parent}
    assert set(reconciles) == {first, second}
    attributes = reconciles[first].attributes or {}
    assert (attributes["ooo_spec.pre_executions"], attributes["ooo_spec.pre_executions.used"],
            attributes["ooo_spec.pre_executions.wasted"]) == (1, 0, 1)
    [tools] = names["agent.tools"]
    assert tools.parent is not None and tools.parent.span_id == first

    # The remote calls continue the trace: sidecar/main through the payload's carrier,
    # tool runs through the current context of the task that sends them.
    assert parent_of(script.sidecar_payloads[0][telemetry.CARRIER_KEY]) == first
    assert [parent_of(p[telemetry.CARRIER_KEY]) for p in script.payloads] == [first, second]
    carriers = dict(pool.carriers)
    assert parent_of(carriers[True]) == first
    assert parent_of(carriers[False]) == tools.context.span_id

    assert sink.total(REQUESTS.name, outcome=out["ooo_spec"]["outcome"]) == 1
    assert sink.total(PRE_EXECUTIONS.name, result="wasted") == 1
    assert sink.total(PRE_EXECUTIONS.name, result="used") == 0  # zero increments are skipped


async def test_a_used_pre_execution_is_counted_with_its_saved_time(
    spans: InMemorySpanExporter,
) -> None:
    clock = ManualClock()
    pool = TracedPool(lookup_s=0.05, clock=clock)
    # The commit waits for the run's result: used, and its whole 50 ms saved.
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], decode_s=0.2,
                    commit_after=pool.finished, clock=clock)
    sink = RecordingSink()
    out = await run(ChatService("m", True, pool, metrics=sink, clock=clock), script,
                    execute_tools=False)
    [result] = out["ooo_spec"]["tool_results"]
    assert result["saved_ms"] == pytest.approx(50)
    assert sink.total(PRE_EXECUTIONS.name, result="used") == 1
    assert sink.total(TOOL_SAVED.name, tool="lookup") == pytest.approx(result["saved_ms"])
    [reconcile] = by_name(spans.get_finished_spans())["reconcile"]
    assert reconcile.attributes is not None
    assert reconcile.attributes["ooo_spec.tools.saved_ms"] == pytest.approx(result["saved_ms"])


async def test_a_failed_request_ends_its_root_as_an_error(spans: InMemorySpanExporter) -> None:
    class Broken(Script):
        async def main_events(self, payload: dict[str, Any], token: Any):  # type: ignore[override]
            raise TurnError("too long")
            yield  # an async generator

    sink = RecordingSink()
    with pytest.raises(ApiError):
        await run(ChatService("m", True, FakePool(), metrics=sink), Broken([]))
    names = by_name(spans.get_finished_spans())
    [root] = names["router.request"]
    [turn] = names["agent.turn"]
    for span in (root, turn):
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "ApiError"
    assert sink.total(REQUESTS.name, outcome="error") == 1


async def test_spans_hold_no_content_unless_the_config_allows_it(
    spans: InMemorySpanExporter,
) -> None:
    pool = TracedPool(lookup_s=0.01)
    script = Script([final([lookup(SECRET)]), final([], content=SECRET)],
                    predictions=[[lookup(SECRET)]], decode_s=0.05)
    await run(ChatService("m", True, pool), script)
    text = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert SECRET not in text and "lookup" in text  # tool names are not content

    final_event = dataclasses.replace(final([lookup(SECRET)]), text=SECRET)
    assert SECRET not in json.dumps(telemetry.main_attributes(final_event, False))
    assert SECRET in json.dumps(telemetry.main_attributes(final_event, True))
    result = {"content": SECRET, "is_error": False, "latency_ms": 3.0}
    hidden = telemetry.tool_attributes("lookup", True, result, {"key": SECRET}, False)
    assert SECRET not in json.dumps(hidden)
    assert hidden["ooo_spec.tool.speculative"] is True
    assert hidden["gen_ai.tool.name"] == "lookup"
    shown = telemetry.tool_attributes("lookup", True, result, {"key": SECRET}, True)
    assert SECRET in shown["gen_ai.tool.call.arguments"]
    prediction = Prediction.model_validate({"candidates": [[lookup(SECRET)]], "elapsed_ms": 9})
    assert SECRET not in json.dumps(telemetry.prediction_attributes(prediction, False))
    assert SECRET in json.dumps(telemetry.prediction_attributes(prediction, True))


def test_record_content_is_off_in_the_default_config() -> None:
    assert load_config({}).telemetry.record_content is False
    assert TelemetryConfig().record_content is False


# ----- metrics --------------------------------------------------------------------------------
def test_hit_rate_window_scores_only_requests_that_could_hit() -> None:
    window = HitRateWindow(4)
    assert window.add("disabled") is None
    assert window.add("no_call") is None
    assert window.add("hit") == 1.0
    assert window.add("sidecar_late") == 0.5
    assert window.add("miss") == pytest.approx(1 / 3)
    assert window.add("hit") == 0.5
    assert window.add("hit") == 0.5  # the first hit left the window of 4
    assert window.add("partial") == 0.5


def test_request_main_sidecar_and_tool_measurements() -> None:
    report = OooSpecReport.model_validate({
        "enabled": True, "outcome": "hit",
        "tool_results": [
            {"tool_call_id": "c1", "name": "lookup", "content": "x", "speculative": True,
             "latency_ms": 50.0, "saved_ms": 40.0},
            {"tool_call_id": "c2", "name": "note", "content": "x", "speculative": False,
             "latency_ms": 5.0, "saved_ms": 0.0},
        ],
    })
    sink = RecordingSink()
    telemetry.record_all(sink, telemetry.request_measurements(report, 3, 1, 0.75))
    assert sink.total("ooo_spec_requests", outcome="hit") == 1
    assert sink.total("ooo_spec_hit_rate") == 0.75
    assert sink.total("ooo_spec_tool_saved_ms") == 40.0  # the speculative result only
    assert sink.total("ooo_spec_pre_executions", result="used") == 1
    assert sink.total("ooo_spec_pre_executions", result="wasted") == 2

    event = final([lookup("a")])
    main = telemetry.main_measurements(event, speculative=True)
    assert {(m.metric.name, m.value) for m in main} == {
        ("ooo_spec_main_steps", 3), ("ooo_spec_drafted_tokens", 4),
        ("ooo_spec_accepted_tokens", 2)}
    assert all(m.tags == {"speculative": "true"} for m in main)
    failed = Prediction(error="boom", elapsed_ms=12.0)
    [sidecar] = telemetry.sidecar_measurements(telemetry.prediction_status(failed), 12.0)
    assert (sidecar.value, sidecar.tags) == (12.0, {"status": "error"})
    assert telemetry.prediction_status(Prediction(no_call=True)) == "no_call"
    assert telemetry.prediction_status(Prediction()) == "ok"
    [tool] = telemetry.tool_measurements("lookup", False, 500.0)
    assert tool.tags == {"tool": "lookup", "speculative": "false"}

    sink = RecordingSink()
    telemetry.record_all(sink, telemetry.prefill_measurements(120, 96))
    assert sink.total("ooo_spec_prompt_tokens", cached="true") == 96
    assert sink.total("ooo_spec_prompt_tokens", cached="false") == 24
    assert telemetry.prefill_measurements(0, 0) == []  # nothing prefilled since


def test_metric_catalogue_is_consistent() -> None:
    names = [m.name for m in telemetry.METRICS]
    assert len(names) == len(set(names))
    for metric in telemetry.METRICS:
        assert metric.name.startswith("ooo_spec_") and metric.description
        # Serve adds these to every metric itself and refuses them as a metric's own tags.
        assert not set(metric.tag_keys) & {"deployment", "replica", "application", "route"}, (
            metric.name)
        if metric.kind == "histogram":
            assert list(metric.boundaries) == sorted(set(metric.boundaries))
            assert metric.boundaries[0] > 0
        else:
            assert metric.boundaries == ()


def test_ids_do_not_repeat_when_libraries_seed_the_random_module() -> None:
    """vLLM seeds `random` with the same value in every engine process; span ids must still
    differ between processes (the SDK's default generator would repeat them)."""
    generator = telemetry.SystemRandomIdGenerator()
    ids = set()
    for _ in range(3):
        random.seed(0)
        ids.add((generator.generate_span_id(), generator.generate_trace_id()))
    assert len(ids) == 3
