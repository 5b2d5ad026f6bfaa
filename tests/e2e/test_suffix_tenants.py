"""The `suffix` draft source on real deployments: a tenant's earlier outputs draft its own later
requests, never another tenant's (issue 30).

A side Router with two API keys (tenants a and b) in front of the session app's main model,
where the suffix indexes live. The same forced call is asked by a, by a again, then by b: at
temperature 0 all three outputs are identical. a's second request drafts from a's first output
(more suffix tokens accepted, fewer main passes); b's request, whose tenant has no past, drafts
exactly what a's first did: the index a built is not b's. The sidecar and history are off for
these requests so the suffix source is what differs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.e2e.cluster import MODEL, delete_side_app, deploy_side_app

pytestmark = pytest.mark.e2e

KEY_A = "suffix-a-key-0123456789"
KEY_B = "suffix-b-key-9876543210"
SIDE = "side-suffix"
TRIP = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip: where, when, how long and a short note",
    "parameters": {"type": "object", "properties": {
        "destination": {"type": "string"}, "month": {"type": "string"},
        "nights": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["destination", "month", "nights", "note"]}}}


@pytest.fixture(scope="module")
def tenants_url(app_url: str) -> Iterator[str]:
    overrides = {"auth": {"api_keys": [{"key": KEY_A, "name": "suffix-a"},
                                     {"key": KEY_B, "name": "suffix-b"}]}}
    url = deploy_side_app(SIDE, app_url, overrides)
    try:
        yield url
    finally:
        delete_side_app(SIDE)


def ask(url: str, key: str) -> tuple[str, dict[str, Any]]:
    client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=180, max_retries=0)
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Plan me a relaxing trip somewhere warm."}],
        tools=[TRIP],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=80,
        extra_body={"ooo_spec": {"sidecar": False, "history": False}},
    )
    calls = response.choices[0].message.tool_calls or []
    assert calls, response
    report: dict[str, Any] = (response.model_extra or {})["ooo_spec"]
    return calls[0].function.arguments, report


def test_a_tenants_outputs_draft_only_its_own_requests(tenants_url: str) -> None:
    a_first, a_first_report = ask(tenants_url, KEY_A)
    a_again, a_again_report = ask(tenants_url, KEY_A)
    b_first, b_first_report = ask(tenants_url, KEY_B)
    assert a_first == a_again == b_first  # greedy and lossless: one output for all three

    def suffix(report: dict[str, Any]) -> dict[str, int]:
        tally: dict[str, int] = report["main"]["sources"]["suffix"]
        return tally

    # a's earlier output drafts a's repeat...
    assert suffix(a_again_report)["accepted_tokens"] > suffix(a_first_report)["accepted_tokens"]
    assert a_again_report["main"]["steps"] < a_first_report["main"]["steps"]
    # ...and nothing of it reaches b: b drafts what a tenant without a past drafts.
    assert suffix(b_first_report) == suffix(a_first_report)
    assert b_first_report["main"]["steps"] == a_first_report["main"]["steps"]
    # Every source is reported, and the request that wanted no sidecar decided nothing.
    assert set(a_first_report["main"]["sources"]) == {"sidecar", "history", "schema", "suffix",
                                                      "lookup"}
    assert a_first_report["sidecar_decisions"] == []
