"""Shared fixtures: the real app on a local Ray (started once per session, by the tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_PORT = int(os.environ.get("OOO_SPEC_TEST_PORT", "18000"))


@pytest.fixture(scope="session")
def serve_config() -> dict:
    from deployments.local import load_serve_config

    config = load_serve_config(ROOT / "configs" / "local.yaml")
    config["http_options"] = {**config.get("http_options", {}), "port": TEST_PORT}
    # Inert until a test arms a fault through a Ray handle (tests/e2e/test_faults.py).
    config["applications"][0]["args"]["faults"] = {"enabled": True}
    # The n-gram baseline engine, for the lossless check of `ooo_spec.baseline`
    # (tests/e2e/test_ngram_baseline.py); local.yaml keeps it off so `make serve` stays light.
    config["applications"][0]["args"]["baselines"] = {"ngram": {"enabled": True}}
    return config


@pytest.fixture(scope="session")
def app_url(serve_config: dict) -> Iterator[str]:
    """Base URL of the whole app (router, main model, sidecar) on a local Ray."""
    from deployments import local

    url = local.start(serve_config)
    try:
        yield url
    finally:
        local.stop()


@pytest.fixture(scope="session")
def openai_client(app_url: str):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{app_url}/v1", api_key="unused", timeout=120, max_retries=0)
