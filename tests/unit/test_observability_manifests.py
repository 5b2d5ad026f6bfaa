"""Offline checks of the metrics wiring in k8s/ (issue #5): the Grafana dashboard charts exactly
the metrics app/telemetry.py defines, under the names Ray exports them, and the PodMonitor
reaches Ray's metrics port on every ooo-spec Ray pod of every overlay."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT

from app import telemetry
from tests.unit.test_k8s_manifests import OVERLAYS, rendered, the

K8S = Path(__file__).resolve().parents[2] / "k8s"
DASHBOARD = K8S / "grafana" / "ooo-spec-dashboard.json"
POD_MONITOR = K8S / "monitoring" / "podmonitor.yaml"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def exported_names() -> dict[str, telemetry.MetricSpec]:
    """Every series name Ray exports for the catalogue: `ray_` prefix, kind suffixes."""
    return {f"ray_{m.name}{suffix}": m for m in telemetry.METRICS for suffix in SUFFIXES[m.kind]}


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_dashboard_charts_every_metric_by_its_exported_name() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    charted: set[str] = set()
    for expr in expressions(dashboard):
        assert expr.count("(") == expr.count(")"), expr
        for name in re.findall(r"\bray_ooo_spec_\w+", expr):
            assert name in exported, f"{name}: not a series Ray exports for app/telemetry.py"
            charted.add(exported[name].name)
            metric = exported[name]
            # Labels the expression groups or filters by must be the metric's tags (or Serve's).
            for label in re.findall(r"by \(([^)]*)\)", expr):
                for key in (k.strip() for k in label.split(",")):
                    assert key in (*metric.tag_keys, "le", "application", "deployment",
                                   "replica"), f"{name} has no label {key!r}"
    assert charted == {m.name for m in telemetry.METRICS}


def serve_metric_names() -> set[str]:
    """The controller's gauges as Ray exports them (`ray_` prefix), read from Serve's source."""
    import ray.serve._private.deployment_state as deployment_state

    source = Path(deployment_state.__file__).read_text()
    return {f"ray_{n}" for n in re.findall(r'metrics\.Gauge\(\s*"(serve_\w+)"', source)}


def autoscaler_metric_names() -> set[str]:
    """What the Ray autoscaler's own Prometheus endpoint exports (no `ray_` prefix)."""
    import prometheus_client
    from ray.autoscaler._private.prom_metrics import AutoscalerPrometheusMetrics

    metrics = AutoscalerPrometheusMetrics(session_name="test")
    metrics.pending_nodes.labels(NodeType="main", SessionName="test").set(1)
    metrics.active_nodes.labels(NodeType="main", SessionName="test").set(1)
    text = prometheus_client.generate_latest(metrics.registry).decode()
    return set(re.findall(r"^# TYPE (\w+) ", text, flags=re.M))


def test_dashboard_charts_replicas_and_pending_nodes_by_their_exported_names() -> None:
    """Issue #21: replicas per deployment (Serve's own gauges) and pending and active nodes per
    worker group (the autoscaler's), under the names Ray exports them."""
    dashboard = json.loads(DASHBOARD.read_text())
    serve_names, autoscaler_names = serve_metric_names(), autoscaler_metric_names()
    assert {"ray_serve_deployment_replica_healthy", "ray_serve_autoscaling_target_replicas"} <= (
        serve_names)
    assert {"autoscaler_pending_nodes", "autoscaler_active_nodes"} <= autoscaler_names
    charted = {name for expr in expressions(dashboard)
               for name in re.findall(r"\b(?:ray_serve|autoscaler)_\w+", expr)}
    assert charted <= serve_names | autoscaler_names, charted - serve_names - autoscaler_names
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}
    replicas = by_title["Replicas per deployment"]
    assert any(re.search(r"sum by \(deployment\) \(ray_serve_deployment_replica_healthy", e)
               for e in replicas), replicas
    nodes = by_title["Ray nodes: pending and active per pool"]
    for name in ("autoscaler_pending_nodes", "autoscaler_active_nodes"):
        assert any(f"by (NodeType) ({name}" in e for e in nodes), nodes


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["expr"] for t in panel["targets"])
        # Every variable an expression uses is defined.
        for variable in re.findall(r"\$(\w+)", json.dumps(panel["targets"])):
            assert variable in variables or variable.startswith("__"), variable
    assert "datasource" in variables


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_scrapes_ray_metrics_on_every_ray_pod(overlay: str) -> None:
    monitor = yaml.safe_load(POD_MONITOR.read_text())
    assert monitor["kind"] == "PodMonitor"
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoint, autoscaler = monitor["spec"]["podMetricsEndpoints"]
    objects = rendered(overlay)
    cluster = the(objects, "RayService")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]
    templates = [head] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        assert selector.items() <= template["metadata"]["labels"].items()
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        # 8080: KubeRay's default --metrics-export-port, where Ray serves /metrics.
        assert ports.get(endpoint["port"]) == 8080
    # The autoscaler's metrics (pending nodes): its default port, named on the head only.
    head_ports = {p["name"]: p["containerPort"] for p in head["spec"]["containers"][0]["ports"]}
    assert head_ports.get(autoscaler["port"]) == AUTOSCALER_METRIC_PORT
    # Jaeger is not a Ray pod: the monitor must not select it.
    jaeger = the(objects, "Deployment", "jaeger")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= jaeger.items()


def vllm_metric_names() -> set[str]:
    """vLLM's own `vllm:*` metrics as Ray exports them through its RayPrometheusStatLogger
    (`ray_` prefix, ':' as '_'), read from vLLM's source."""
    import vllm.v1.metrics.loggers as loggers
    import vllm.v1.spec_decode.metrics as spec_metrics

    names: set[str] = set()
    for module in (loggers, spec_metrics):
        names |= set(re.findall(r'"vllm:(\w+)"', Path(module.__file__).read_text()))
    return {f"ray_vllm_{n}" for n in names}


def test_dashboard_charts_vllms_standard_panels_by_their_exported_names() -> None:
    """Issue 42: the engines' own metrics (latency, throughput, queue, KV and prefix cache,
    speculative acceptance per position), each a series vLLM exports through Ray."""
    dashboard = json.loads(DASHBOARD.read_text())
    known = vllm_metric_names()
    charted = set()
    for expr in expressions(dashboard):
        for name in re.findall(r"\bray_vllm_\w+", expr):
            base = re.sub(r"_(total|bucket|count|sum)$", "", name)
            assert base in known, f"{name}: not a metric vLLM exports"
            charted.add(base)
    assert {"ray_vllm_time_to_first_token_seconds", "ray_vllm_inter_token_latency_seconds",
            "ray_vllm_e2e_request_latency_seconds", "ray_vllm_num_requests_running",
            "ray_vllm_num_requests_waiting", "ray_vllm_kv_cache_usage_perc",
            "ray_vllm_prefix_cache_hits", "ray_vllm_generation_tokens",
            "ray_vllm_spec_decode_num_accepted_tokens_per_pos"} <= charted
