"""`PrefixAffinityRouter`: Serve's request router for the MainModel and Sidecar deployments that
sends a tenant's next turn to the replica holding its prompt prefix in the KV cache.

Set in a deployment's `request_router_config` (configs/*.yaml):

    request_router_config:
      request_router_class: deployments.prefix_router:PrefixAffinityRouter
      request_router_kwargs: {min_match_chars: 256, max_imbalance: 4, max_entries: 100000,
                              max_entries_per_tenant: 25000}

Serve builds it in every process that holds a handle to the deployment (here the Router
replicas). The request's first argument is the payload the Router sends (the chat request with
the tenant under `TENANT_KEY`, app/tenancy.py); the logic is `app/api/prefix_index.py`, this
file is glue. Anything it cannot key (no payload, a completions prompt) goes to power of two
choices, as does a short match or a replica loaded beyond `max_imbalance`. Each decision is
counted (`ooo_spec_routing_decisions`, app/telemetry.py), logged, and left in `ROUTING_LOG` under
the payload's route id for the request's `ooo_spec.routing`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

from app import telemetry
from app.api import prefix_index
from app.api.prefix_index import (
    ROUTE_KEY,
    PromptKey,
    TenantPrefixIndex,
    affinity_decision,
    prompt_key,
)
from app.tenancy import ANONYMOUS_TENANT, TENANT_KEY
from deployments.metrics import ServeMetrics

logger = logging.getLogger(__name__)


def payload_key(args: list[Any]) -> PromptKey | None:
    """The prompt key of a Router payload (`args[0]`), or None when it holds no chat."""
    payload = args[0] if args else None
    if not isinstance(payload, Mapping):
        return None
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    tools = payload.get("tools")
    tenant = payload.get(TENANT_KEY, ANONYMOUS_TENANT)
    # The client's own affinity key (app/openai_models.py `SamplingFields.affinity_key`).
    session = payload.get("prompt_cache_key") or payload.get("session_id")
    try:
        return prompt_key(str(tenant), tools if isinstance(tools, list) else [], messages,
                          session if isinstance(session, str) else None)
    except Exception:
        # Raised inside Serve's routing, the request would never be assigned and would wait
        # out its timeout holding its Router slot: route it by power of two choices instead.
        logger.warning("could not key a payload for affinity routing", exc_info=True)
        return None


def payload_route(args: list[Any]) -> str | None:
    """The route id the Router put in its payload (`ROUTE_KEY`), or None."""
    payload = args[0] if args else None
    route_id = payload.get(ROUTE_KEY) if isinstance(payload, Mapping) else None
    return route_id if isinstance(route_id, str) else None


class PrefixAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Power of two choices, except that a request whose tenant and prompt prefix a live
    replica served goes there first (see the module doc)."""

    def initialize_state(self, min_match_chars: int = 256, max_imbalance: int = 4,
                         max_entries: int = 100_000, max_entries_per_tenant: int | None = None,
                         **unknown: Any) -> None:
        if unknown:  # a misspelt knob must not be ignored
            raise ValueError(f"PrefixAffinityRouter: unknown request_router_kwargs "
                             f"{sorted(unknown)}")
        # None: a quarter of `max_entries` (app/api/prefix_index.py).
        self._index = TenantPrefixIndex(max_entries, max_entries_per_tenant)
        self._min_match_chars = min_match_chars
        self._max_imbalance = max_imbalance
        self._metrics = ServeMetrics()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        fallback = await super().choose_replicas(candidate_replicas, pending_request)
        key = payload_key(pending_request.args) if pending_request is not None else None
        if key is None:
            return fallback
        live = {r.replica_id.unique_id: r for r in candidate_replicas}
        queue_lens = {}
        for unique_id, replica in live.items():
            queue_len = self._replica_queue_len_cache.get(replica.replica_id)
            if queue_len is not None:
                queue_lens[unique_id] = queue_len
        decision = affinity_decision(self._index.longest_match(key, live), queue_lens,
                                     self._min_match_chars, self._max_imbalance)
        target = self._deployment_id.name if self._deployment_id else "unknown"
        telemetry.record_all(self._metrics, telemetry.routing_measurements(target,
                                                                          decision.reason))
        logger.info("route %s: %s, matched %d chars, replica %s", target, decision.reason,
                    decision.matched, decision.replica)
        route_id = payload_route(pending_request.args) if pending_request is not None else None
        if route_id is not None:
            # Through the module: Serve pickles this module by value into the Router, and a
            # copied log would be one nobody reads.
            prefix_index.ROUTING_LOG.record(route_id, target, decision)
        if decision.replica is None:
            return fallback
        # Its queue full, the request goes on to the fallback's replicas rather than wait.
        return [[live[decision.replica]], *fallback]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        key = payload_key(pending_request.args)
        if key is not None:
            self._index.insert(key, replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = set(self._replica_id_set)
        super().update_replicas(replicas)
        for gone in before - set(self._replica_id_set):
            self._index.drop_replica(gone.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.drop_replica(replica_id.unique_id)
