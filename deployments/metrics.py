"""`ServeMetrics`: the library's `MetricsSink` on `ray.serve.metrics`.

Ray Serve adds the deployment, replica and application tags and exports everything on Ray's
Prometheus endpoint (`ray_<name>`, counters with `_total`). Metric objects are created on first
use, inside the replica, where Serve's replica context exists.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import metrics

from app.telemetry import Measurement, MetricSpec

logger = logging.getLogger(__name__)


class ServeMetrics:
    def __init__(self) -> None:
        self._metrics: dict[str, Any] = {}

    def _metric(self, spec: MetricSpec) -> Any:
        metric = self._metrics.get(spec.name)
        if metric is None:
            tag_keys: Any = spec.tag_keys  # Ray annotates a 1-tuple; any tuple works
            if spec.kind == "counter":
                metric = metrics.Counter(spec.name, spec.description, tag_keys)
            elif spec.kind == "gauge":
                metric = metrics.Gauge(spec.name, spec.description, tag_keys)
            else:
                metric = metrics.Histogram(
                    spec.name, spec.description, list(spec.boundaries), tag_keys
                )
            self._metrics[spec.name] = metric
        return metric

    def record(self, measurement: Measurement) -> None:
        spec = measurement.metric
        tags = dict(measurement.tags)
        try:
            metric = self._metric(spec)
            if spec.kind == "counter":
                metric.inc(measurement.value, tags=tags)
            elif spec.kind == "gauge":
                metric.set(measurement.value, tags=tags)
            else:
                metric.observe(measurement.value, tags=tags)
        except Exception:  # a metric must never fail a request
            logger.exception("recording %s failed", spec.name)
