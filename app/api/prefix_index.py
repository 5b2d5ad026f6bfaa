"""Which replica holds a tenant's prompt prefix in its KV cache: the state behind cache-affinity
routing (deployments/prefix_router.py).

An agent's next turn is its previous turn plus a tool result; vLLM's prefix cache makes it cheap
only on the replica that served the previous turn, and only for the same tenant (every engine
request carries the tenant as `cache_salt`). So a prompt is keyed per tenant, as the chat
template renders it: the tools, then each message in order (`prompt_key`). Each segment's hash
chains the ones before it, so equal hashes mean equal prefixes, and the index maps
(tenant, prefix hash) to the replica that last served a prompt with that prefix.

- `insert`: every prefix of a routed prompt now points at the replica it went to;
- `longest_match`: the longest prefix of a prompt that a live replica holds, with its length
  (characters of the rendered segments: the router has no tokenizer, and characters track
  tokens closely enough to decide whether a match is worth keeping);
- bounded memory per tenant: at most `max_entries_per_tenant` prefixes of one tenant and
  `max_entries` in all, least recently used evicted first, from the tenant holding the most
  when the whole index is full (no tenant can flush another's);
- `drop_replica`: a replica that left (downscale, redeploy, crash) is never chosen again;
- `affinity_decision`: that replica, or power of two choices when the match is short or that
  replica is loaded beyond the configured imbalance;
- `RoutingLog`: each decision, until the request that caused it reports it (`ooo_spec.routing`).

Tenants never share an entry: the tenant is part of every key and seeds every hash.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.openai_models import RoutingReason


@dataclass(frozen=True)
class PromptKey:
    """A tenant's prompt as a chain of prefixes: `hashes[i]` names the first `i + 1` segments,
    `lengths[i]` is how many characters they hold."""

    tenant: str
    hashes: tuple[str, ...]
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class PrefixMatch:
    """The replica holding the longest matching prefix, and that prefix's length in
    characters."""

    replica: str
    length: int


# What a client's own affinity key (`prompt_cache_key`, `session_id`) counts for as a matched
# prefix: more than any `min_match_chars`, so a match on the key alone keeps affinity.
SESSION_WEIGHT = 1 << 30


def prompt_key(tenant: str, tools: Sequence[Any], messages: Sequence[Any],
               session: str | None = None) -> PromptKey:
    """The key of a chat prompt: the tools (the templates render them first, in the system
    block), then every message in order, each as canonical JSON (key order ignored).
    `session`: the client's affinity key, first in the chain, so requests naming it go where
    it was last served within the tenant, whatever their messages."""
    segments = [_canonical(list(tools))] + [_canonical(m) for m in messages]
    weights = [len(segment) for segment in segments]
    if session is not None:
        segments.insert(0, f"\x01session\x00{session}")
        weights.insert(0, SESSION_WEIGHT)
    digest = hashlib.blake2b(_bytes(tenant), digest_size=16).hexdigest()
    hashes: list[str] = []
    lengths: list[int] = []
    total = 0
    for segment, weight in zip(segments, weights, strict=True):
        digest = hashlib.blake2b(_bytes(f"{digest}\x00{segment}"), digest_size=16).hexdigest()
        total += weight
        hashes.append(digest)
        lengths.append(total)
    return PromptKey(tenant, tuple(hashes), tuple(lengths))


def _bytes(text: str) -> bytes:
    # Keying runs inside Serve's `choose_replicas`, where an exception is logged and the
    # request never assigned (it waits out its timeout): a lone surrogate, which the router's
    # checks refuse anyway, still hashes here rather than raising.
    return text.encode("utf-8", "surrogatepass")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


@dataclass
class _Entry:
    replica: str
    length: int


class TenantPrefixIndex:
    """(tenant, prefix) -> the replica that last served it. Each tenant keeps at most
    `max_entries_per_tenant` (its own least recently used go first), and when all tenants
    together hold `max_entries`, the tenant holding the most loses its least recently used:
    one tenant's flood of long conversations (one entry per message) evicts its own entries,
    never another's while that one holds less. Not thread-safe: the request router calls it
    from its event loop only."""

    def __init__(self, max_entries: int, max_entries_per_tenant: int | None = None) -> None:
        if max_entries < 1 or (max_entries_per_tenant is not None and max_entries_per_tenant < 1):
            raise ValueError("max_entries and max_entries_per_tenant must be at least 1")
        self.max_entries = max_entries
        # Default: a quarter of the index, so at least four tenants fit whole.
        self.max_entries_per_tenant = min(max_entries_per_tenant or max(1, max_entries // 4),
                                          max_entries)
        # Each tenant's entries, least recently used first; the tenants in the same order.
        self._tenants: OrderedDict[str, OrderedDict[str, _Entry]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def held(self, tenant: str) -> int:
        """Entries `tenant` holds."""
        return len(self._tenants.get(tenant, ()))

    def insert(self, key: PromptKey, replica: str) -> None:
        """Every prefix of `key` now points at `replica` (the one that just served it)."""
        entries = self._tenants.setdefault(key.tenant, OrderedDict())
        self._tenants.move_to_end(key.tenant)
        for digest, length in zip(key.hashes, key.lengths, strict=True):
            if digest not in entries:
                self._size += 1
            entries[digest] = _Entry(replica, length)
            entries.move_to_end(digest)
        while len(entries) > self.max_entries_per_tenant:
            entries.popitem(last=False)
            self._size -= 1
        while self._size > self.max_entries:
            # The least recently used of the tenants holding the most (`max` keeps the first).
            largest = max(self._tenants.values(), key=len)
            largest.popitem(last=False)
            self._size -= 1
        self._forget_empty()

    def longest_match(self, key: PromptKey, replicas: Collection[str]) -> PrefixMatch | None:
        """The longest prefix of `key` held by one of `replicas` (the live ones), or None."""
        entries = self._tenants.get(key.tenant)
        if entries is None:
            return None
        for position in range(len(key.hashes) - 1, -1, -1):
            entry = entries.get(key.hashes[position])
            if entry is not None and entry.replica in replicas:
                self._tenants.move_to_end(key.tenant)
                # The shorter prefixes are in use as part of this one: all recently used.
                for digest in key.hashes[: position + 1]:
                    if digest in entries:
                        entries.move_to_end(digest)
                return PrefixMatch(entry.replica, entry.length)
        return None

    def drop_replica(self, replica: str) -> None:
        """Forget every prefix `replica` held: it is gone and its cache with it."""
        for entries in self._tenants.values():
            for digest in [d for d, e in entries.items() if e.replica == replica]:
                del entries[digest]
                self._size -= 1
        self._forget_empty()

    def _forget_empty(self) -> None:
        for tenant in [t for t, entries in self._tenants.items() if not entries]:
            del self._tenants[tenant]

    def replicas(self) -> set[str]:
        return {e.replica for entries in self._tenants.values() for e in entries.values()}


@dataclass(frozen=True)
class AffinityDecision:
    """Where a request goes: `replica` when affinity chose it, None to fall back to power of
    two choices; `matched`: the longest prefix's length (0 without one)."""

    replica: str | None
    matched: int
    reason: RoutingReason


def affinity_decision(
    match: PrefixMatch | None,
    queue_lens: Mapping[str, int],
    min_match_chars: int,
    max_imbalance: int,
) -> AffinityDecision:
    """Prefer the replica holding the longest prefix, unless the match is shorter than
    `min_match_chars` (not worth a worse-loaded replica) or that replica's queue is more than
    `max_imbalance` requests longer than the shortest known one (load comes first then).
    `queue_lens`: the live replicas' queue lengths that are known (an unknown one is not held
    against affinity)."""
    if match is None:
        return AffinityDecision(None, 0, "no_match")
    if match.length < min_match_chars:
        return AffinityDecision(None, match.length, "short_match")
    own = queue_lens.get(match.replica)
    if own is not None and queue_lens and own - min(queue_lens.values()) > max_imbalance:
        return AffinityDecision(None, match.length, "imbalanced")
    return AffinityDecision(match.replica, match.length, "affinity")


# The payload key under which the Router names one engine call (a fresh id per turn), so that
# its request router's decision can be found again by the request that caused it.
ROUTE_KEY = "_route"


class RoutingLog:
    """The decisions this process's request routers made, by route id and target deployment,
    until the request that caused them takes them for its `ooo_spec.routing`.

    Serve runs a handle's request router on its own event loop thread in the caller's process
    (the Router replica), so the decision cannot travel back with the call: it is left here.
    Bounded: an entry nobody takes (a call that failed) is evicted oldest first."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], AffinityDecision] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, route_id: str, target: str, decision: AffinityDecision) -> None:
        """The latest decision for the call wins (a full queue makes Serve choose again)."""
        with self._lock:
            self._entries[(route_id, target)] = decision
            self._entries.move_to_end((route_id, target))
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def take(self, route_id: str, target: str) -> AffinityDecision | None:
        """The decision for the call, once; None when no affinity router decided it."""
        with self._lock:
            return self._entries.pop((route_id, target), None)


ROUTING_LOG = RoutingLog()
