"""Issue 31 on real engines: cache-affinity routing with two MainModel replicas.

The session app's MainModel is held at two replicas (an autoscaling edit: the running replica
stays, a second one starts). Three tenants (API keys of a side Router) each hold a multi-turn
agent conversation, all three the same conversation word for word, turn after turn: each turn
is the last one plus a tool call and its result, as an agent sends it.

- With `PrefixAffinityRouter` (configs/local.yaml sets it): every follow-up turn lands on the
  replica that ran the tenant's previous turn and the engine reports its prefix as cached;
  each tenant's first turn matches nothing, although the same prompt was sent by the others
  (tenants never share a prefix, in the router or in vLLM's cache: the tenant is the salt).
- With Serve's own router (a side app's own two MainModel replicas, the same engine settings,
  no `request_router_config`), the same conversations of fresh tenants: the answers are the
  same, word for word; where the follow-ups land and what the cache gave them is printed, and
  the cache gives no more than with affinity.
- Back to one replica while the conversations go on: the replica removed by the downscale
  stops receiving requests (its prefixes leave the router's index) and no request fails.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.cluster import (
    chat,
    delete_side_app,
    deploy_side_app,
    handle,
    local_args,
    serve_details,
    settled,
    wait_for,
)

pytestmark = pytest.mark.e2e

TENANTS = 3
TURNS = 4
SETTLE_TIMEOUT_S = 600
LOOKUP = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look up an order in the shop's records.",
    "parameters": {"type": "object", "required": ["order_id"], "properties": {
        "order_id": {"type": "string", "description": "The order's id, e.g. A-1001."},
        "fields": {"type": "array", "items": {"type": "string"},
                   "description": "Which fields to return; all when absent."}}}}}


def conversation(turn: int) -> list[dict[str, Any]]:
    """Turn `turn` of the agent's conversation: the question, then one call and its result
    for each earlier turn (results long enough to fill whole KV blocks)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": (
        "Check orders A-1001 to A-1004 one by one and tell me which have shipped.")}]
    for i in range(turn):
        order = f"A-{1001 + i}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{i}", "type": "function",
                "function": {"name": "lookup_order", "arguments": f'{{"order_id": "{order}"}}'}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": " ".join(
                f"{order} line {n}: item {n * 7 % 13}, qty {n % 4 + 1}, status packed;"
                for n in range(12))}]
    return messages


@dataclass(frozen=True)
class Turn:
    tenant: int
    turn: int
    started: float  # monotonic, when the request was sent
    replica: str
    decision: str | None
    cached_tokens: int
    prompt_tokens: int
    answer: tuple[str | None, tuple[tuple[str, str], ...]]


def run_conversations(url: str, keys: list[str], tenants: int = TENANTS) -> list[Turn]:
    """The first `tenants` tenants' conversations side by side, each tenant's turns in order."""
    def one(tenant: int) -> list[Turn]:
        turns = []
        for turn in range(TURNS):
            body = {"messages": conversation(turn), "tools": [LOOKUP], "temperature": 0,
                    "max_tokens": 12, "ooo_spec": {"enabled": False}}
            started = time.monotonic()
            r = chat(url, body, headers={"Authorization": f"Bearer {keys[tenant]}"})
            assert r.status_code == 200, r.text
            data = r.json()
            [route] = data["ooo_spec"]["routing"]
            message = data["choices"][0]["message"]
            calls = tuple((c["function"]["name"], c["function"]["arguments"])
                          for c in message.get("tool_calls") or [])
            assert route["cached_tokens"] == data["usage"]["prompt_tokens_details"][
                "cached_tokens"]
            turns.append(Turn(tenant, turn, started, route["replica"], route["decision"],
                              route["cached_tokens"], route["prompt_tokens"],
                              (message["content"], calls)))
        return turns

    with ThreadPoolExecutor(max_workers=tenants) as pool:
        return [t for turns in pool.map(one, range(tenants)) for t in turns]


def follow_ups(turns: list[Turn]) -> list[tuple[Turn, Turn]]:
    """(previous turn, follow-up) of every tenant."""
    by_tenant = sorted(turns, key=lambda t: (t.tenant, t.turn))
    return [(a, b) for a, b in zip(by_tenant, by_tenant[1:], strict=False)
            if a.tenant == b.tenant]


def main_replicas() -> list[str]:
    return [r["replica_id"] for r in serve_details()["deployments"]["MainModel"]["replicas"]
            if r["state"] == "RUNNING"]


def with_main(config: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The session config with MainModel held at `replicas` (an autoscaling edit: Serve
    applies it to the running replicas)."""
    edited = copy.deepcopy(config)
    (app,) = edited["applications"]
    [main] = [d for d in app["deployments"] if d["name"] == "MainModel"]
    main["autoscaling_config"] = {**main["autoscaling_config"],
                                  "min_replicas": replicas, "max_replicas": replicas}
    return edited


def own_main(replicas: int) -> Any:
    """A MainModel deployment of a side app's own, as the session's (configs/local.yaml's
    engine settings) but with Serve's own request router; no core reserved. It calls the
    session's Sidecar, as the session's main replicas do."""
    from app.config import load_config
    from deployments.main_model import MainModel

    shared = load_config(local_args()).model_dump(mode="json", exclude={"auth"})
    return MainModel.options(  # type: ignore[attr-defined]
        num_replicas=replicas, max_ongoing_requests=16, ray_actor_options={"num_cpus": 0},
    ).bind(shared, None, handle("Sidecar"))


def keys_for(run: str) -> tuple[list[str], dict[str, Any]]:
    """API keys of fresh tenants (nothing of theirs cached yet) and the side app's auth."""
    keys = [f"affinity-{run}-{i}-{uuid.uuid4().hex}" for i in range(TENANTS)]
    auth = {"api_keys": [{"key": k, "name": f"{run}-tenant-{i}"} for i, k in enumerate(keys)]}
    return keys, {"auth": auth}


@pytest.fixture(scope="module")
def two_replicas(app_url: str, serve_config: dict[str, Any]) -> Iterator[str]:
    from deployments import local

    wait_for("the session app settled", settled, SETTLE_TIMEOUT_S, every_s=1)
    before = main_replicas()
    try:
        local.deploy(with_main(serve_config, 2))
        wait_for("two MainModel replicas", lambda: len(main_replicas()) == 2 and settled(),
                 SETTLE_TIMEOUT_S, every_s=1)
        assert set(before) <= set(main_replicas())  # the running one stayed
        yield app_url
    finally:
        local.deploy(serve_config)
        wait_for("one MainModel replica again", lambda: len(main_replicas()) == 1 and settled(),
                 SETTLE_TIMEOUT_S, every_s=1)


def test_follow_up_turns_stay_with_their_cache_and_a_downscale_loses_nothing(
    two_replicas: str, serve_config: dict[str, Any]
) -> None:
    from deployments import local

    # 1. Cache affinity.
    keys, overrides = keys_for("on")
    url = deploy_side_app("side-affinity", two_replicas, overrides)
    try:
        on = run_conversations(url, keys)
        # 2. Serve's own router: a side app with its own two MainModel replicas (the same
        #    engine settings, no request_router_config) and fresh tenants. Not the session
        #    MainModel with its router removed: that edit changes the app's code version
        #    (ray/serve/_private/deploy_utils.py:get_app_code_version), restarting every replica.
        off_keys, off_overrides = keys_for("off")
        off_url = deploy_side_app("side-p2c", two_replicas, off_overrides, main=own_main(2))
        try:
            off = run_conversations(off_url, off_keys)
        finally:
            delete_side_app("side-p2c")
        replicas = main_replicas()

        stayed_on = [b for a, b in follow_ups(on) if b.replica == a.replica]
        stayed_off = [b for a, b in follow_ups(off) if b.replica == a.replica]
        print(f"follow-up turns on their previous turn's replica: affinity "
              f"{len(stayed_on)}/{len(follow_ups(on))}, cached tokens "
              f"{sum(t.cached_tokens for t in on)}; Serve's router "
              f"{len(stayed_off)}/{len(follow_ups(off))}, cached tokens "
              f"{sum(t.cached_tokens for t in off)}; requests per replica with affinity "
              f"{sorted(sum(t.replica == r for t in on) for r in replicas)}")
        assert len(stayed_on) >= 0.9 * len(follow_ups(on)), on
        assert all(t.decision == "affinity" and t.cached_tokens > 0 for t in stayed_on), on
        # Same prompt, three tenants: no tenant's first turn found another's prefix.
        firsts = [t for t in on if t.turn == 0]
        assert all(t.decision == "no_match" and t.cached_tokens == 0 for t in firsts), firsts
        assert all(t.decision is None for t in off), off
        assert sum(t.cached_tokens for t in on) >= sum(t.cached_tokens for t in off)
        # The answers do not depend on where a turn ran or what was cached.
        answers = {(t.tenant, t.turn): t.answer for t in on}
        assert {(t.tenant, t.turn): t.answer for t in off} == answers

        # 3. Back to one replica while the tenants go on with their conversations.
        stop = threading.Event()
        results: list[Turn] = []
        failures: list[BaseException] = []

        def converse() -> None:
            try:
                while not stop.is_set():
                    results.extend(run_conversations(url, keys))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        worker = threading.Thread(target=converse, daemon=True)
        worker.start()
        local.deploy(serve_config)
        wait_for("one MainModel replica", lambda: len(main_replicas()) == 1 and settled(),
                 SETTLE_TIMEOUT_S, every_s=1)
        [kept] = main_replicas()
        gone_at = time.monotonic()
        wait_for("a whole conversation sent after the downscale",
                 lambda: failures or sum(t.started > gone_at for t in results) >= TURNS,
                 SETTLE_TIMEOUT_S)
        stop.set()
        worker.join(timeout=SETTLE_TIMEOUT_S)
        assert not worker.is_alive() and not failures, failures  # every request answered
        # Once the replica was gone, only the one left served.
        assert all(t.replica == kept for t in results if t.started > gone_at), results
    finally:
        delete_side_app("side-affinity")
