"""The grammar compile check before the engine (app.engine.grammar_check), on a small
vocabulary so it runs without a model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import xgrammar as xgr

from app.check_pool import CheckPool
from app.engine.grammar_check import GrammarCheck, GrammarTooSlow
from tests.unit.loop_ticks import loop_ticks

VOCAB = [chr(c) for c in range(32, 127)] + ['{"', '":', '",', "ab", "</s>"]
SIMPLE = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def slow_schema(letters: str = "a-z", properties: int = 12) -> dict:
    """Bounded repeats compile slowly (about 2 s per property on the real vocabulary). On this
    test vocabulary the first compile of a process also pays xgrammar's warm-up (3.4 s for 12
    properties, then 0.1 s for a grammar like it), so a test that must see a slow compile
    wherever it runs in the process asks for more properties (64: about 0.9 s warm)."""
    return {"type": "object", "properties": {
        f"p{i}": {"type": "string", "pattern": rf"([{letters}]{{1,9}}\.){{1,100}}"}
        for i in range(properties)}, "required": [f"p{i}" for i in range(properties)]}


SLOW = slow_schema()


TENANT = "tenant-a"


def checker(timeout_s: float, max_wait_s: float = 60, per_tenant: int = 1) -> GrammarCheck:
    return GrammarCheck(xgr.TokenizerInfo(VOCAB, stop_token_ids=[len(VOCAB) - 1]), timeout_s,
                        max_wait_s, CheckPool(2, per_tenant, "grammar-test"))


async def test_a_quick_grammar_passes_and_is_remembered() -> None:
    check = checker(30)
    await check.check(SIMPLE, TENANT)
    assert len(check._verdicts) == 1
    compiles: list[str] = []
    original = check._compile
    check._compile = lambda kind, text: compiles.append(kind) or original(kind, text)  # type: ignore[method-assign]
    await check.check(dict(reversed(list(SIMPLE.items()))), TENANT)  # same schema, other key order
    assert compiles == [] and len(check._verdicts) == 1


async def test_a_slow_grammar_is_refused_at_the_limit_without_blocking_the_loop() -> None:
    check = checker(0.05)
    started = time.perf_counter()
    async with loop_ticks(0.005) as ticks:
        with pytest.raises(GrammarTooSlow, match="CPU time"):
            await check.check(SLOW, TENANT)
    elapsed = time.perf_counter() - started
    assert elapsed < 1 and ticks.count >= 3
    assert list(check._verdicts.values()) == [False]


async def test_a_check_waiting_for_a_thread_is_refused_at_the_wait_cap() -> None:
    """Both check threads held (say by refused slow compiles that go on): a new schema gets no
    CPU at all, and is refused at `max_wait_s` rather than held."""
    check = checker(30, max_wait_s=0.3, per_tenant=2)
    release = threading.Event()
    held = [asyncio.ensure_future(check.pool.run(TENANT, i, lambda: release.wait(10), 30, 30))
            for i in range(2)]
    await asyncio.sleep(0)  # a turn of the loop: both hold their threads before the check queues
    started = time.perf_counter()
    with pytest.raises(GrammarTooSlow):
        await check.check(SIMPLE, TENANT)
    release.set()
    await asyncio.gather(*held)
    assert 0.3 <= time.perf_counter() - started < 5


async def test_a_schema_that_does_not_compile_is_left_to_the_engine() -> None:
    await checker(30).check({"type": "string", "format": "no-such-format", "minLength": 9,
                             "maxLength": 1}, TENANT)


async def test_the_served_bounded_whitespace_grammar_is_checked_too() -> None:
    """Forced calls are served the EBNF of app.engine.json_grammar by default: its compile is
    timed as well, and a slow one refused."""
    from app.engine.json_grammar import bounded_whitespace_grammar

    check = checker(30)
    await check.check_ebnf(bounded_whitespace_grammar(SIMPLE, 32), TENANT)
    assert len(check._verdicts) == 1
    with pytest.raises(GrammarTooSlow):
        await checker(0.05).check_ebnf(
            bounded_whitespace_grammar(slow_schema("b-y", properties=64), 32), TENANT)


async def test_a_refused_grammar_is_refused_at_once_the_next_time() -> None:
    """The verdict is about the schema: the same tenant's next request with it is refused
    without compiling it again (the first compile may still be running in its thread)."""
    check = checker(0.05)
    with pytest.raises(GrammarTooSlow):
        await check.check(SLOW, TENANT)
    with pytest.raises(GrammarTooSlow, match="refused before"):
        await check.check(SLOW, TENANT)


async def test_n_identical_checks_compile_once() -> None:
    check = checker(30)
    compiles: list[str] = []
    original = check._compile
    check._compile = lambda kind, text: compiles.append(kind) or original(kind, text)  # type: ignore[method-assign]
    await asyncio.gather(*(check.check(SIMPLE, TENANT) for _ in range(8)))
    assert compiles == ["json"]


async def test_regexes_are_checked_for_the_sidecar() -> None:
    check = checker(30)
    await check.check_sampling({"structured_regex": "[a-z]{1,5}"}, TENANT)
    await check.check_sampling({"max_tokens": 1}, TENANT)  # no grammar: nothing to check
    assert list(check._verdicts) == [(TENANT, "regex", "[a-z]{1,5}")]
