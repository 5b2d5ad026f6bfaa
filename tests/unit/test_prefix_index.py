"""The per-tenant prefix index behind cache-affinity routing (app/api/prefix_index.py)."""

from __future__ import annotations

from typing import Any

import pytest

from app.api.prefix_index import (
    AffinityDecision,
    PrefixMatch,
    RoutingLog,
    TenantPrefixIndex,
    prompt_key,
)

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


def turn(n: int) -> list[dict[str, Any]]:
    """A conversation after `n` tool rounds: each round adds the call and its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up a, then b."}]
    for i in range(n):
        messages.append({"role": "assistant", "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"value {i}"})
    return messages


def test_a_follow_up_turn_matches_the_replica_of_the_previous_one() -> None:
    index = TenantPrefixIndex(max_entries=100)
    first = prompt_key("t1", TOOLS, turn(0))
    index.insert(first, "r1")
    follow_up = prompt_key("t1", TOOLS, turn(1))
    match = index.longest_match(follow_up, {"r1", "r2"})
    assert match == PrefixMatch("r1", first.lengths[-1])
    assert match.length < follow_up.lengths[-1]  # the new messages are not cached yet


def test_the_key_ignores_key_order_and_diverges_where_the_prompt_does() -> None:
    reordered = [{"content": "Look up a, then b.", "role": "user"}]
    assert prompt_key("t", TOOLS, turn(0)) == prompt_key("t", TOOLS, reordered)
    other_tools = prompt_key("t", [], turn(0))
    assert not set(other_tools.hashes) & set(prompt_key("t", TOOLS, turn(0)).hashes)
    longer = prompt_key("t", TOOLS, turn(2))
    assert longer.hashes[:2] == prompt_key("t", TOOLS, turn(0)).hashes
    assert list(longer.lengths) == sorted(longer.lengths)


def test_two_tenants_with_identical_prompts_never_count_as_one_prefix() -> None:
    index = TenantPrefixIndex(max_entries=100)
    a, b = prompt_key("tenant-a", TOOLS, turn(1)), prompt_key("tenant-b", TOOLS, turn(1))
    assert not set(a.hashes) & set(b.hashes)
    index.insert(a, "r1")
    assert index.longest_match(b, {"r1", "r2"}) is None
    index.insert(b, "r2")
    assert len(index) == len(a.hashes) + len(b.hashes)
    assert index.longest_match(a, {"r1", "r2"}) == PrefixMatch("r1", a.lengths[-1])
    assert index.longest_match(b, {"r1", "r2"}) == PrefixMatch("r2", b.lengths[-1])


def test_a_removed_replica_is_never_chosen() -> None:
    index = TenantPrefixIndex(max_entries=100)
    index.insert(prompt_key("t", TOOLS, turn(0)), "r2")  # the tools and first message on r2
    index.insert(prompt_key("t", TOOLS, turn(1)), "r1")  # the whole first round on r1
    follow_up = prompt_key("t", TOOLS, turn(2))
    assert index.longest_match(follow_up, {"r1", "r2"}).replica == "r1"  # type: ignore[union-attr]
    # Not among the live replicas: skipped, whatever the index holds.
    assert index.longest_match(follow_up, {"r2"}) is None  # r1 took the shorter prefixes too
    index.drop_replica("r1")
    assert "r1" not in index.replicas()
    assert index.longest_match(follow_up, {"r1", "r2"}) is None
    index.insert(prompt_key("t", TOOLS, turn(0)), "r2")
    assert index.longest_match(follow_up, {"r1", "r2"}).replica == "r2"  # type: ignore[union-attr]


def test_memory_is_bounded_and_the_least_recently_used_prefix_goes_first() -> None:
    index = TenantPrefixIndex(max_entries=6, max_entries_per_tenant=6)
    keys = [prompt_key(f"t{i}", TOOLS, turn(0)) for i in range(4)]  # 2 prefixes each
    index.insert(keys[0], "r1")
    index.insert(keys[1], "r1")
    index.insert(keys[2], "r1")
    assert index.longest_match(keys[0], {"r1"}) is not None  # t0 used again: most recent
    index.insert(keys[3], "r1")
    assert len(index) == 6
    # Of the tenants holding the most, the least recently used lose their oldest prefix.
    assert (index.held("t1"), index.held("t2")) == (1, 1)
    assert all(index.longest_match(k, {"r1"}) is not None for k in (keys[0], keys[3]))
    assert index.held("t0") == index.held("t3") == 2
    with pytest.raises(ValueError):
        TenantPrefixIndex(max_entries=0)
    with pytest.raises(ValueError):
        TenantPrefixIndex(max_entries=8, max_entries_per_tenant=0)


def test_one_tenants_long_conversations_never_evict_another_tenants_prefixes() -> None:
    """Issue 39: one entry per message, so ~200 requests of 512 tiny messages flushed every
    other tenant's affinity from one shared LRU. Each tenant now has its own capacity, and a
    full index takes from the tenant holding the most."""
    index = TenantPrefixIndex(max_entries=100, max_entries_per_tenant=40)
    victim = prompt_key("victim", TOOLS, turn(3))  # 8 prefixes: the tools, 7 messages
    index.insert(victim, "r1")
    for flood in range(50):
        many = [{"role": "user", "content": f"{flood}-{i}"} for i in range(30)]
        index.insert(prompt_key("flooder", TOOLS, many), "r2")
    assert index.held("flooder") == 40 and index.held("victim") == 8
    assert index.longest_match(victim, {"r1", "r2"}) == PrefixMatch("r1", victim.lengths[-1])
    # Many flooding tenants (keys) fill the whole index: still the largest lose first.
    for other in range(5):
        for flood in range(3):
            many = [{"role": "user", "content": f"{other}-{flood}-{i}"} for i in range(30)]
            index.insert(prompt_key(f"flooder-{other}", TOOLS, many), "r2")
    assert len(index) == 100
    assert index.longest_match(victim, {"r1", "r2"}) == PrefixMatch("r1", victim.lengths[-1])
    index.drop_replica("r2")
    assert len(index) == 8 and index.replicas() == {"r1"}


def test_routing_log_hands_each_decision_over_once_and_stays_bounded() -> None:
    log = RoutingLog(max_entries=3)
    affinity = AffinityDecision("r1", 300, "affinity")
    log.record("a", "MainModel", AffinityDecision(None, 0, "no_match"))
    log.record("a", "MainModel", affinity)  # Serve chose again: the latest decision counts
    log.record("a", "Sidecar", AffinityDecision(None, 40, "short_match"))
    assert log.take("a", "MainModel") == affinity
    assert log.take("a", "MainModel") is None
    for route in ("b", "c", "d"):  # calls whose requests never came for their decisions
        log.record(route, "MainModel", affinity)
    assert len(log) == 3
    assert log.take("a", "Sidecar") is None  # the oldest went first
    assert log.take("d", "MainModel") == affinity


def test_a_prompt_that_cannot_be_encoded_is_keyed_without_raising() -> None:
    # Keying runs inside Serve's routing, where an exception leaves the request unassigned
    # until its timeout (issue 39): a lone surrogate (refused by the router's checks anyway)
    # must still hash.
    odd = [{"role": "user", "content": "a\ud800"}]
    key = prompt_key("t\udfff", [{"description": "\udbff"}], odd)
    assert len(key.hashes) == 2 and key != prompt_key("t", [], odd)
    assert prompt_key("t", [], odd) != prompt_key("t", [], [{"role": "user", "content": "a"}])
