"""Speculation privacy on real deployments (Ghost Tool Calls: a speculative call already tells
the tool's backend what the user probably wants).

A side app (tests/e2e/cluster.py) with its own ToolWorker, so its counts are its own, where
`slow_lookup` is marked `egress` and egress is not allowed. The request narrows `key` to an
enum so the sidecar's candidate is right (as in test_tools_e2e, where the same call on the
session app is pre-executed): pre-execution would happen if the policy let it, and must not.
The global switch (`tool_worker.pre_execute: false`) is covered by the unit tests of the
policy (tests/unit/test_tool_policy.py, test_agent_loop.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import call, chat, delete_side_app, deploy_side_app

pytestmark = pytest.mark.e2e

MAX_TRIES = 6


def lookup_request(app_url: str) -> dict[str, Any]:
    entry = next(t for t in httpx.get(f"{app_url}/v1/tools", timeout=30).json()["data"]
                 if t["function"]["name"] == "slow_lookup")
    function = copy.deepcopy(entry["function"])
    function["parameters"]["properties"]["key"]["enum"] = ["paris", "london", "tokyo"]
    return {
        "messages": [{"role": "user", "content": "Look up the record 'paris'."}],
        "tools": [{"type": "function", "function": function}],
        "tool_choice": {"type": "function", "function": {"name": "slow_lookup"}},
        "temperature": 0, "max_tokens": 48,
        "ooo_spec": {"enabled": True, "execute_tools": True, "max_steps": 1,
                     "server_tools": True},
    }


def predicted(report: dict[str, Any]) -> bool:
    return any(c["source"] == "sidecar" and c["name"] == "slow_lookup" and c["valid"]
               for c in report["candidates"])


def run_until_predicted(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests until the main replica had the sidecar's valid candidate for the call in time
    at least once (a late sidecar proves nothing); each one's `ooo_spec` report."""
    reports = []
    for _ in range(MAX_TRIES):
        r = chat(url, body)
        assert r.status_code == 200, r.text
        reports.append(r.json()["ooo_spec"])
        if predicted(reports[-1]):
            return reports
    raise AssertionError(f"no valid candidate in {MAX_TRIES} tries: the test proves nothing")


def assert_never_speculated(app: str, reports: list[dict[str, Any]]) -> None:
    for rep in reports:
        assert rep["tool_results"] and not any(t["speculative"] for t in rep["tool_results"])
    received = call("ToolWorker", "received_calls", app=app)
    assert received.get("slow_lookup:speculative", 0) == 0, received
    assert received.get("slow_lookup:committed", 0) == len(reports), received


@pytest.fixture(scope="module")
def egress_url(app_url: str) -> Iterator[str]:
    overrides = {"tool_worker": {"allow_egress": False,
                                 "overrides": {"slow_lookup": {"egress": True}}}}
    url = deploy_side_app("side-egress", app_url, overrides, own_tool_worker=True)
    try:
        yield url
    finally:
        delete_side_app("side-egress")


def test_egress_tool_is_never_pre_executed(app_url: str, egress_url: str) -> None:
    assert_never_speculated("side-egress",
                            run_until_predicted(egress_url, lookup_request(app_url)))
    # The worker refuses on its own too, should a router ever send one.
    refused = call("ToolWorker", "execute", "slow_lookup", {"key": "paris"}, speculative=True,
                   app="side-egress")
    assert refused["is_error"] and "not allowed by the tool policy" in refused["content"]

