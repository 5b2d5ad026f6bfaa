"""Issue 29 on real deployments: one tenant's slow grammars cannot starve another tenant.

Tenant A floods the main replica with 4 concurrent forced calls, each with its own schema of 8
string properties of distinct long `maxLength`s: about 2 s of grammar compile per property on
the embedded model's vocabulary, some 16 s of CPU per request, each refused (400
`grammar_too_slow`) once its compile has spent `limits.grammar_compile_timeout_s`. Once A's
first refusal is back (every one of A's compiles is then running or queued), tenant B sends a
forced call with a schema nobody sent before. B is answered, with its call, while A's flood is
still being refused: before the last of A's answers.

The verdict is an order of events, not a time, so a loaded machine cannot change it: A's
compiles run one at a time on A's share of the pool (limits.check_threads_per_tenant), each
until its refusal, so A's last answer comes several compile budgets after B's question. Before
the check pool (app/check_pool.py) the pre-check had 2 threads shared first-come first-served
and a refused compile kept its thread: B's check queued behind all of A's compiles, and B was
answered after A's last refusal (run against that code, 49 s after it asked)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import LimitsConfig
from tests.e2e.cluster import chat, delete_side_app, deploy_side_app, serves_normally

pytestmark = pytest.mark.e2e

KEY_A = "fairness-a-key-0123456789"
KEY_B = "fairness-b-key-9876543210"
SIDE = "side-fairness"
LIMITS = LimitsConfig()
FLOOD = 4


def forced(parameters: dict[str, Any], content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}],
            "tools": [{"type": "function", "function": {"name": "lookup",
                                                        "parameters": parameters}}],
            "tool_choice": "required", "temperature": 0, "max_tokens": 64}


def slow_schema(index: int) -> dict[str, Any]:
    """8 long strings, lengths no other request uses: nothing to share, every grammar new."""
    properties = {f"field_{i}": {"type": "string", "maxLength": 2000 + 8 * index + i}
                  for i in range(8)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def tenants_url(app_url: str) -> Iterator[str]:
    # A's whole flood is admitted: the point is what the check pool does with it.
    overrides = {"auth": {"api_keys": [{"key": KEY_A, "name": "a"}, {"key": KEY_B, "name": "b"}],
                          "max_concurrent_per_key": 1024}}
    url = deploy_side_app(SIDE, app_url, overrides)
    try:
        yield url
    finally:
        delete_side_app(SIDE)


def test_one_tenants_slow_grammars_do_not_delay_another_tenants_call(
    app_url: str, tenants_url: str
) -> None:
    answers: list[httpx.Response] = []
    first_answer = threading.Event()

    def flood(index: int) -> None:
        body = forced(slow_schema(index), "Look up 'alpha'.")
        answers.append(chat(tenants_url, body, timeout=300, headers=bearer(KEY_A)))
        first_answer.set()

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(FLOOD)]
    for thread in threads:
        thread.start()
    # A's first refusal: every one of A's compiles has been asked for by then.
    assert first_answer.wait(timeout=240), "tenant A's flood got no answer at all"

    fresh = f"name_{uuid.uuid4().hex[:8]}"
    small = {"type": "object", "properties": {fresh: {"type": "string"}}, "required": [fresh]}
    b = chat(tenants_url, forced(small, "Look up 'alpha'."), timeout=300, headers=bearer(KEY_B))
    a_answered_before_b = len(answers)
    assert b.status_code == 200, b.text
    [call] = b.json()["choices"][0]["message"]["tool_calls"]
    assert fresh in json.loads(call["function"]["arguments"])
    assert a_answered_before_b < FLOOD, "tenant B was answered only after all of tenant A's flood"

    for thread in threads:
        thread.join()
    assert len(answers) == FLOOD
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "grammar_too_slow", answer.text
    serves_normally(app_url)
