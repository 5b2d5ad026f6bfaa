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
    index = TenantPrefixIndex(max_entries=6)
    keys = [prompt_key(f"t{i}", TOOLS, turn(0)) for i in range(4)]  # 2 prefixes each
    index.insert(keys[0], "r1")
    index.insert(keys[1], "r1")
    index.insert(keys[2], "r1")
    assert index.longest_match(keys[0], {"r1"}) is not None  # t0 used again: most recent
    index.insert(keys[3], "r1")
    assert len(index) == 6
    assert index.longest_match(keys[1], {"r1"}) is None  # t1 was the least recently used
    assert all(index.longest_match(k, {"r1"}) is not None for k in (keys[0], keys[2], keys[3]))
    with pytest.raises(ValueError):
        TenantPrefixIndex(max_entries=0)


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
