"""`PrefixAffinityRouter` (deployments/prefix_router.py) as Serve drives it, with replicas that
answer queue-length probes in-process, and `affinity_decision` (app/api/prefix_index.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve._private.request_router.common import PendingRequest
from ray.serve.config import RequestRouterConfig

from app.api.prefix_index import (
    ROUTE_KEY,
    ROUTING_LOG,
    AffinityDecision,
    PrefixMatch,
    affinity_decision,
)
from app.tenancy import TENANT_KEY
from deployments.prefix_router import PrefixAffinityRouter, payload_key

MAIN = DeploymentID(name="MainModel", app_name="ooo-spec")
ROUTER_PATH = "deployments.prefix_router:PrefixAffinityRouter"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


class FakeReplica:
    """What the router reads of a running replica; its queue length is `queue_len`."""

    def __init__(self, unique_id: str, queue_len: int = 0) -> None:
        self.replica_id = ReplicaID(unique_id=unique_id, deployment_id=MAIN)
        self.queue_len = queue_len
        self.node_id = "node"
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()
        self.max_ongoing_requests = 16
        self.routing_stats: dict[str, Any] = {}
        self.is_cross_language = False

    def update_replica_info(self, info: Any) -> None:
        pass

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def router(replicas: list[FakeReplica], **kwargs: Any) -> PrefixAffinityRouter:
    """The router as Serve builds it in the Router's process: the class set by its import path
    in `request_router_config`, which Serve pickles with its module by value."""
    config = RequestRouterConfig(request_router_class=ROUTER_PATH)
    router_class = config.get_request_router_class()
    made = router_class(deployment_id=MAIN, handle_source=DeploymentHandleSource.UNKNOWN,
                        use_replica_queue_len_cache=True)
    made.initialize_state(**{"min_match_chars": 50, **kwargs})
    made.update_replicas(replicas)  # type: ignore[arg-type]
    return made


def request(tenant: str, rounds: int) -> PendingRequest:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up a, then b."}]
    for i in range(rounds):
        messages += [{"role": "assistant", "tool_calls": [{"id": f"c{i}", "type": "function",
                      "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": f"value {i}"}]
    payload = {"messages": messages, "tools": TOOLS, TENANT_KEY: tenant}
    return PendingRequest(args=[payload, []], kwargs={},
                          metadata=RequestMetadata(request_id="r", internal_request_id="i"))


async def route(made: PrefixAffinityRouter, replicas: list[FakeReplica],
                pending: PendingRequest) -> str:
    """The replica Serve would send `pending` to: the first rank's least-loaded one."""
    for rank in await made.choose_replicas(replicas, pending):  # type: ignore[arg-type]
        best = min(rank, key=lambda r: r.queue_len)  # type: ignore[attr-defined]
        made.on_request_routed(pending, best.replica_id, None)
        return str(best.replica_id.unique_id)
    raise AssertionError("no replica chosen")


async def test_follow_up_turns_land_where_their_previous_turn_ran() -> None:
    replicas = [FakeReplica("r1"), FakeReplica("r2")]
    made = router(replicas)
    for tenant in ("a", "b", "c", "d"):
        first = await route(made, replicas, request(tenant, 0))
        for rounds in (1, 2, 3):
            assert await route(made, replicas, request(tenant, rounds)) == first


async def test_a_loaded_replica_gives_way_to_power_of_two_choices() -> None:
    replicas = [FakeReplica("r1"), FakeReplica("r2")]
    made = router(replicas, max_imbalance=2)
    first = await route(made, replicas, request("a", 0))
    busy = next(r for r in replicas if r.replica_id.unique_id == first)
    busy.queue_len = 5
    made._replica_queue_len_cache.update(busy.replica_id, 5)
    other = next(r for r in replicas if r is not busy)
    made._replica_queue_len_cache.update(other.replica_id, 0)
    assert await route(made, replicas, request("a", 1)) != first


async def test_a_removed_replica_drops_out_and_its_tenants_move_on() -> None:
    replicas = [FakeReplica("r1"), FakeReplica("r2")]
    made = router(replicas)
    first = await route(made, replicas, request("a", 0))
    left = [r for r in replicas if r.replica_id.unique_id != first]
    made.update_replicas(left)  # type: ignore[arg-type]  # the downscale
    assert first not in made._index.replicas()
    assert await route(made, left, request("a", 1)) == left[0].replica_id.unique_id


async def test_each_decision_is_left_for_the_request_that_caused_it() -> None:
    replicas = [FakeReplica("r1"), FakeReplica("r2")]
    made = router(replicas)
    first, follow_up = request("a", 0), request("a", 1)
    first.args[0][ROUTE_KEY], follow_up.args[0][ROUTE_KEY] = "turn-1", "turn-2"
    served = await route(made, replicas, first)
    await route(made, replicas, follow_up)
    assert ROUTING_LOG.take("turn-1", "MainModel") == AffinityDecision(None, 0, "no_match")
    decision = ROUTING_LOG.take("turn-2", "MainModel")
    assert decision is not None and decision.reason == "affinity"
    assert decision.replica == served and decision.matched > 50
    assert ROUTING_LOG.take("turn-2", "MainModel") is None  # taken once
    # A payload without a route id (another caller's) leaves nothing behind.
    before = len(ROUTING_LOG)
    await route(made, replicas, request("b", 0))
    assert len(ROUTING_LOG) == before


async def test_payload_key_reads_the_routers_payload() -> None:
    key = payload_key(request("a", 1).args)
    assert key is not None and key.tenant == "a" and len(key.hashes) == 4  # tools + 3 messages
    assert payload_key([]) is None
    assert payload_key([{"prompt": "text"}]) is None  # completions: power of two choices
    # Whatever the payload holds, keying never raises inside Serve's routing (issue 39): a
    # payload it cannot key goes to power of two choices.
    odd = {"messages": [{"role": "user", "content": "a\ud800"}], "tools": [{"x": {1, 2}}]}
    assert payload_key([odd]) is not None
    with mock.patch("deployments.prefix_router.prompt_key", side_effect=TypeError("odd")):
        assert payload_key(request("a", 1).args) is None


def test_affinity_decision() -> None:
    match = PrefixMatch("r1", 500)
    assert affinity_decision(None, {}, 100, 4) == AffinityDecision(None, 0, "no_match")
    assert affinity_decision(match, {}, 600, 4) == AffinityDecision(None, 500, "short_match")
    assert affinity_decision(match, {"r1": 9, "r2": 4}, 100, 4).reason == "imbalanced"
    assert affinity_decision(match, {"r1": 8, "r2": 4}, 100, 4) == AffinityDecision(
        "r1", 500, "affinity")
    assert affinity_decision(match, {"r2": 0}, 100, 4).replica == "r1"  # r1's load unknown


async def test_a_clients_session_key_is_its_affinity_key() -> None:
    """Issue 42: `prompt_cache_key` (else `session_id`) first in the key, within the tenant."""
    base = dict(request("a", 1).args[0])
    one = payload_key([{**base, "prompt_cache_key": "conv"}])
    other = payload_key([{**base, "messages": [{"role": "user", "content": "new"}],
                          "session_id": "conv"}])
    assert one is not None and other is not None and one.hashes[0] == other.hashes[0]
    plain = payload_key([base])
    assert plain is not None and len(one.hashes) == len(plain.hashes) + 1
