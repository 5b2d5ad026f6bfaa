"""Traces and metrics of the deployed app (issue #5).

The session's app (tests/conftest.py) exports spans over OTLP/HTTP to a real receiver in this
process (`tests/otlp_receiver.py`, decoding the protobuf) and serves Ray's Prometheus endpoint on
`metrics_port`. Requests go through the real `openai` client."""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import telemetry
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
PROMPT = "Look up the record 'paris'."
# Spans every `execute_tools` request with a forced server-known call must produce;
# `candidate.validate` only when the sidecar's answer reached the main replica in time.
ALWAYS = {"router.request", "agent.turn", "sidecar.predict", "main.generate", "tool.execute",
          "reconcile", "agent.tools"}
COMPONENT = {
    "router.request": "router", "agent.turn": "router", "reconcile": "router",
    "agent.tools": "router", "sidecar.predict": "sidecar", "main.generate": "main",
    "candidate.validate": "main", "tool.execute": "tool_worker",
}


@pytest.fixture(scope="module")
def lookup_tool(app_url: str) -> dict[str, Any]:
    """`slow_lookup` as a client copies it from /v1/tools, with `key` narrowed to an enum so the
    135M sidecar predicts it right often (see tests/e2e/test_tools_e2e.py)."""
    listing = httpx.get(f"{app_url}/v1/tools", timeout=30).json()["data"]
    [entry] = [t for t in listing if t["function"]["name"] == "slow_lookup"]
    tool = {"type": "function", "function": copy.deepcopy(entry["function"])}
    tool["function"]["parameters"]["properties"]["key"]["enum"] = ["paris", "london", "tokyo"]
    return tool


def ask(client: Any, tool: dict[str, Any], traceparent: str | None = None) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "slow_lookup"}},
        temperature=0,
        max_tokens=48,
        extra_headers={"traceparent": traceparent} if traceparent else None,
        # The same question every time: history and the tenant's suffix source would draft the
        # earlier answer at time zero and the main model would finish before the sidecar, so
        # no prediction could ever be pre-executed (what the metrics test needs once).
        extra_body={"ooo_spec": {"enabled": True, "execute_tools": True, "max_steps": 1,
                                 "server_tools": True, "history": False, "suffix": False}},
    )


def only(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def check_trace(spans: list[ReceivedSpan], client_span: str, report: dict[str, Any]) -> None:
    names = {s.name for s in spans}
    assert ALWAYS <= names, f"missing spans: {sorted(ALWAYS - names)}"
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    for span in spans:
        assert span.parent_span_id in ids | {None}, f"{span.name}: dangling parent"
        assert span.resource["ooo_spec.component"] == COMPONENT[span.name], span.name
        assert span.resource["service.name"] == "ooo-spec-test"
        assert span.status_code != 2, f"{span.name} failed: {span.attributes}"
    pids = {s.resource["process.pid"] for s in spans}
    assert len(pids) >= 3, f"spans from {len(pids)} processes only"
    assert len({s.resource["process.pid"] for s in spans
                if s.resource["ooo_spec.component"] != "router"}) >= 3

    [root] = only(spans, "router.request")
    # The server's own trace, linked to the client's span: never its child.
    assert root.parent_span_id is None
    assert [link[1] for link in root.links] == [client_span]
    assert root.attributes["ooo_spec.outcome"] == report["outcome"]
    assert root.attributes["ooo_spec.main.steps"] == report["main"]["steps"]
    assert root.attributes["ooo_spec.main.accepted_tokens"] == report["main"]["accepted_tokens"]
    saved = sum(r["saved_ms"] for r in report["tool_results"])
    assert root.attributes["ooo_spec.tools.saved_ms"] == pytest.approx(saved)

    # Turn 0 forces the call (speculated, executed); turn 1 answers with tool_choice 'none'.
    turns = sorted(only(spans, "agent.turn"), key=lambda s: s.attributes["ooo_spec.turn"])
    assert [t.attributes["ooo_spec.turn"] for t in turns] == [0, 1]
    assert all(t.parent_span_id == root.span_id for t in turns)
    first, last = turns[0].span_id, turns[1].span_id
    assert turns[0].attributes["gen_ai.tool.names"] == ["slow_lookup"]
    assert turns[1].attributes["ooo_spec.tool_choice"] == "none"

    [sidecar] = only(spans, "sidecar.predict")
    assert sidecar.parent_span_id == first
    # 'cancelled': the main model finished first and the router stopped the prediction.
    assert sidecar.attributes["ooo_spec.sidecar.status"] in ("ok", "no_call", "error",
                                                             "cancelled")
    assert sidecar.attributes["ooo_spec.sidecar.elapsed_ms"] > 0
    mains = {m.parent_span_id: m for m in only(spans, "main.generate")}
    assert set(mains) == {first, last}
    for main in mains.values():
        steps = main.attributes["ooo_spec.main.steps"]
        assert 1 <= steps <= main.attributes["ooo_spec.main.completion_tokens"]
        accepted = main.attributes["ooo_spec.main.accepted_tokens"]
        assert 0 <= accepted <= main.attributes["ooo_spec.main.drafted_tokens"]
    assert sum(m.attributes["ooo_spec.main.steps"] for m in mains.values()) == (
        report["main"]["steps"])
    validations = only(spans, "candidate.validate")
    received = mains[first].attributes["ooo_spec.sidecar.status"] == "received"
    # The candidate was validated in the main replica exactly when it arrived while decoding.
    assert len(validations) == (1 if received else 0)
    for validation in validations:
        assert validation.parent_span_id == mains[first].span_id

    reconciles = {r.parent_span_id: r for r in only(spans, "reconcile")}
    assert set(reconciles) == {first, last}
    assert reconciles[first].attributes["ooo_spec.outcome"] == report["outcome"]
    [tools] = only(spans, "agent.tools")
    assert tools.parent_span_id == first
    runs = only(spans, "tool.execute")
    for run in runs:
        assert run.attributes["gen_ai.tool.name"] == "slow_lookup"
        speculative = run.attributes["ooo_spec.tool.speculative"]
        assert isinstance(speculative, bool)
        # Pre-executions belong to the turn; committed runs to the turn's tool round.
        assert run.parent_span_id == (first if speculative else tools.span_id)
    [result] = report["tool_results"]
    if result["speculative"]:
        assert reconciles[first].attributes["ooo_spec.pre_executions.used"] == 1
    else:
        assert any(not r.attributes["ooo_spec.tool.speculative"] for r in runs)

    # No content on spans by default: neither the prompt nor the tool's argument or result.
    values = [str(v) for s in spans for v in s.attributes.values()]
    for secret in (PROMPT, "paris", result["content"]):
        assert not any(secret in v for v in values), f"{secret!r} leaked into a span"


def linked_root(receiver: OtlpReceiver, client_trace: str) -> ReceivedSpan:
    """The `router.request` span linked to the client's trace (it starts a trace of its own)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for span in receiver.spans():
            if span.name == "router.request" and any(t == client_trace for t, _ in span.links):
                return span
        time.sleep(0.5)
    raise AssertionError(f"no router.request span linked to {client_trace}")


def test_one_request_is_one_trace_across_the_deployments(
    openai_client: Any, otlp_receiver: OtlpReceiver, lookup_tool: dict[str, Any]
) -> None:
    """router.request → agent.turn → sidecar.predict, main.generate (→ candidate.validate),
    tool.execute, reconcile, agent.tools; from the router, sidecar, main and tool worker
    processes. Up to three requests, until the sidecar's candidate reaches the main replica
    in time for `candidate.validate` (on this CPU it is often later than the main model)."""
    seen: set[str] = set()
    for _ in range(3):
        trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
        response = ask(openai_client, lookup_tool, f"00-{trace_id}-{client_span}-01")
        report = response.model_extra["ooo_spec"]
        server_trace = linked_root(otlp_receiver, trace_id).trace_id
        spans = otlp_receiver.wait_for(server_trace, ALWAYS, timeout_s=90)
        check_trace(spans, client_span, report)
        seen |= {s.name for s in spans}
        if "candidate.validate" in seen:
            break
    assert ALWAYS | {"candidate.validate"} <= seen


def test_a_request_without_traceparent_starts_its_own_trace(
    openai_client: Any, otlp_receiver: OtlpReceiver, lookup_tool: dict[str, Any]
) -> None:
    before = {s.span_id for s in otlp_receiver.spans()}
    ask(openai_client, lookup_tool)
    deadline = time.monotonic() + 60
    roots: list[ReceivedSpan] = []
    while not roots and time.monotonic() < deadline:
        time.sleep(0.5)
        roots = [s for s in otlp_receiver.spans()
                 if s.name == "router.request" and s.span_id not in before
                 and s.attributes.get("ooo_spec.turns") == 2]
    assert roots, "no new router.request span arrived"
    assert roots[0].parent_span_id is None


# ----- metrics ------------------------------------------------------------------------------
Samples = list[tuple[str, dict[str, str], float]]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for n, have, v in samples if n == name and labels.items() <= have.items())


def prom(metric: telemetry.MetricSpec, suffix: str = "") -> str:
    """The name Ray exports a metric under."""
    return f"ray_{metric.name}{'_total' if metric.kind == 'counter' else ''}{suffix}"


def wait_until(port: int, ready: Callable[[Samples], bool], timeout_s: float = 120) -> Samples:
    # Ray's workers report every few seconds (RAY_metrics_report_interval_ms, 10 s default).
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(port)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(2)


def test_ray_metrics_endpoint_has_the_metrics_with_plausible_values(
    openai_client: Any, metrics_port: int, lookup_tool: dict[str, Any]
) -> None:
    before = scrape(metrics_port)
    reports = [ask(openai_client, lookup_tool).model_extra["ooo_spec"] for _ in range(3)]
    # Until one response used a pre-executed result, so the saved-time metric has a value
    # (the sidecar is often later than the main model on this CPU).
    while len(reports) < 8 and not any(r["speculative"] for rep in reports
                                       for r in rep["tool_results"]):
        reports.append(ask(openai_client, lookup_tool).model_extra["ooo_spec"])

    def delta(samples: Samples, name: str, **labels: str) -> float:
        return total(samples, name, **labels) - total(before, name, **labels)

    requests = prom(telemetry.REQUESTS)
    # The same question each time: from the second on, its prompt is in the prefix cache.
    cached = sum(r["cached_tokens"] for rep in reports for r in rep["routing"])
    assert cached > 0, [rep["routing"] for rep in reports]
    tool_count = prom(telemetry.TOOL_LATENCY, "_count")
    used = sum(r["speculative"] for rep in reports for r in rep["tool_results"])
    assert used >= 1, f"no pre-executed result was used in {len(reports)} requests"

    def shortfalls(samples: Samples) -> list[str]:
        """Lower bounds our requests put on the counters that do not hold (yet). Lower bounds
        only: an earlier test's requests may be exported after `before` was taken."""
        bounds = {
            (requests, ()): len(reports),
            (prom(telemetry.ACCEPTED_TOKENS), ()): sum(r["main"]["accepted_tokens"]
                                                       for r in reports),
            (prom(telemetry.DRAFTED_TOKENS), ()): sum(r["main"]["drafted_tokens"]
                                                      for r in reports),
            # Two main calls per request: the forced call, then the text answer.
            (prom(telemetry.MAIN_STEPS, "_count"), ()): 2 * len(reports),
            # The sidecar runs for every request's first turn.
            (prom(telemetry.SIDECAR_LATENCY, "_count"), ()): len(reports),
            # slow_lookup runs at least once per request (pre-executed or committed).
            (tool_count, (("tool", "slow_lookup"),)): len(reports),
            (prom(telemetry.PRE_EXECUTIONS), (("result", "used"),)): used,
            (prom(telemetry.TOOL_SAVED, "_count"), (("tool", "slow_lookup"),)): used,
            # Every main call's prompt, and the part the prefix cache served, as reported.
            (prom(telemetry.PROMPT_TOKENS), (("deployment", "MainModel"),)): sum(
                r["prompt_tokens"] for rep in reports for r in rep["routing"]),
            (prom(telemetry.PROMPT_TOKENS), (("deployment", "MainModel"),
                                             ("cached", "true"))): cached,
            # The session app routes MainModel calls by cache affinity (configs/local.yaml).
            (prom(telemetry.ROUTING_DECISIONS), (("target", "MainModel"),)): 2 * len(reports),
        }
        for outcome in {r["outcome"] for r in reports}:
            bounds[(requests, (("outcome", outcome),))] = sum(
                r["outcome"] == outcome for r in reports)
        return [f"{name}{dict(labels)} grew {delta(samples, name, **dict(labels))} < {bound}"
                for (name, labels), bound in bounds.items()
                if delta(samples, name, **dict(labels)) < bound]

    after = wait_until(metrics_port, lambda s: not shortfalls(s))
    missing = shortfalls(after)
    assert not missing, missing

    names = {n for n, _, _ in after}
    absent = [exported for metric in telemetry.METRICS
              if (exported := prom(metric, "_count" if metric.kind == "histogram" else ""))
              not in names]
    assert not absent, f"not on Ray's metrics endpoint: {absent}"

    rates = [(labels, value) for name, labels, value in after if name == prom(telemetry.HIT_RATE)]
    assert rates
    for labels, value in rates:
        assert 0.0 <= value <= 1.0
        assert labels["deployment"] == "Router"

    # Counters are exact: at least as many tokens verified as accepted.
    assert delta(after, prom(telemetry.DRAFTED_TOKENS)) >= delta(
        after, prom(telemetry.ACCEPTED_TOKENS))
    steps = delta(after, prom(telemetry.MAIN_STEPS, "_count"))
    assert delta(after, prom(telemetry.MAIN_STEPS, "_bucket"), le="+Inf") == steps
    # Sidecar latency is in milliseconds: not every prediction fits in the 5 ms bucket.
    sidecar = prom(telemetry.SIDECAR_LATENCY, "_count")
    assert delta(after, prom(telemetry.SIDECAR_LATENCY, "_bucket"), le="5.0") < delta(
        after, sidecar)

    # slow_lookup sleeps 500 ms: every recorded run is above the 250 ms bucket.
    latency = prom(telemetry.TOOL_LATENCY, "_bucket")
    assert delta(after, latency, tool="slow_lookup", le="250.0") == 0
    assert delta(after, latency, tool="slow_lookup", le="+Inf") == delta(
        after, tool_count, tool="slow_lookup")

    # Pre-executions are either used or wasted.
    pre = prom(telemetry.PRE_EXECUTIONS)
    assert {labels["result"] for name, labels, _ in after if name == pre} <= {"used", "wasted"}


def test_each_engine_exports_vllms_own_metrics_through_ray(
    openai_client: Any, metrics_port: int, lookup_tool: dict[str, Any]
) -> None:
    """vLLM's `vllm:*` metrics (its RayPrometheusStatLogger, issue 42) per replica, under vLLM's
    names as Ray exports them (`ray_` prefix, ':' as '_') and vLLM's labels, speculative
    acceptance per draft position included."""
    ask(openai_client, lookup_tool)
    wanted = {"ray_vllm_num_requests_running", "ray_vllm_kv_cache_usage_perc",
              "ray_vllm_generation_tokens_total", "ray_vllm_time_to_first_token_seconds_count",
              "ray_vllm_spec_decode_num_draft_tokens_total",
              "ray_vllm_spec_decode_num_accepted_tokens_per_pos_total"}
    samples = wait_until(metrics_port, lambda s: wanted <= {n for n, _, _ in s})
    missing = wanted - {n for n, _, _ in samples}
    assert not missing, f"not on Ray's metrics endpoint: {sorted(missing)}"
    generated = [(labels, value) for name, labels, value in samples
                 if name == "ray_vllm_generation_tokens_total"]
    assert any(value > 0 for _, value in generated), generated
    # One series per engine: the main model's and the sidecar's replicas, by Serve replica.
    for labels, _ in generated:
        assert labels["model_name"] == MODEL and labels["ReplicaId"], labels
    assert len({labels["ReplicaId"] for labels, _ in generated}) >= 2, generated
    positions = {labels["position"] for name, labels, _ in samples
                 if name == "ray_vllm_spec_decode_num_accepted_tokens_per_pos_total"}
    assert "0" in positions, positions
