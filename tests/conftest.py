"""Shared fixtures: the real app on a local Ray (started once per session, by the tests)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import TOOL_MODULES
from tests.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
TEST_PORT = int(os.environ.get("OOO_SPEC_TEST_PORT", "18000"))


@pytest.fixture(scope="session")
def serve_config() -> dict:
    from deployments.local import load_serve_config

    config = load_serve_config(ROOT / "configs" / "local.yaml")
    config["http_options"] = {**config.get("http_options", {}), "port": TEST_PORT}
    # Inert until a test arms a fault through a Ray handle (tests/e2e/test_faults.py).
    config["applications"][0]["args"]["faults"] = {"enabled": True}
    # The bench's slow_lookup (load_tests/bench_tools.py): the tool tests pre-execute it.
    config["applications"][0]["args"]["tools"] = list(TOOL_MODULES)
    # Tests of the sidecar's path need it called on every request that wants it; skipping a
    # sidecar that does not pay (app/api/sidecar_value.py) would depend on the requests
    # earlier tests sent. Its decisions are tested in tests/unit/test_sidecar_value.py.
    config["applications"][0]["args"]["speculation"]["sidecar_value"] = {"enabled": False}
    # Drafts are sized (off by default; on here so the end-to-end tests cover it) from a fixed
    # verify-cost ratio, not from the engine's measured step times
    # (app/drafting/draft_worth.py): tests compare draft tallies across requests, and sizes
    # measured on a machine that other tests load would differ from run to run.
    config["applications"][0]["args"]["speculation"]["draft_worth"] = {
        "enabled": True, "measure_steps": False}
    return config


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Where every replica of the session's app sends its spans (OTLP over HTTP)."""
    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """Ray's Prometheus endpoint of the session's app (a free port, not Ray's random one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def app_url(serve_config: dict, otlp_receiver: OtlpReceiver, metrics_port: int) -> Iterator[str]:
    """Base URL of the whole app (router, main model, sidecar) on a local Ray. Tracing is on
    (to `otlp_receiver`, flushed every 200 ms) as it is on a cluster with Jaeger."""
    from deployments import local

    tracing = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "ooo-spec-test",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    url = local.start(serve_config, env=tracing, metrics_export_port=metrics_port)
    try:
        yield url
    finally:
        local.stop()


@pytest.fixture(scope="session")
def openai_client(app_url: str):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{app_url}/v1", api_key="unused", timeout=120, max_retries=0)

