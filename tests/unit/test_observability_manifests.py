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
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    objects = rendered(overlay)
    cluster = the(objects, "RayService")["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        assert selector.items() <= template["metadata"]["labels"].items()
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        # 8080: KubeRay's default --metrics-export-port, where Ray serves /metrics.
        assert ports.get(endpoint["port"]) == 8080
    # Jaeger is not a Ray pod: the monitor must not select it.
    jaeger = the(objects, "Deployment", "jaeger")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= jaeger.items()
