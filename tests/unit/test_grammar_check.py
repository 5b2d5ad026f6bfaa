"""The grammar compile check before the engine (app.formats.grammar_check), on a small
vocabulary so it runs without a model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import xgrammar as xgr

from app.check_pool import CheckPool
from app.formats import grammar_check
from app.formats.grammar_check import GrammarCheck, GrammarKind, GrammarTooSlow

VOCAB = [chr(c) for c in range(32, 127)] + ['{"', '":', '",', "ab", "</s>"]
SIMPLE = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def slow_schema(letters: str = "a-z", properties: int = 12) -> dict:
    """Bounded repeats compile slowly (about 2 s per property on the real vocabulary, 0.15 s for
    12 on this test vocabulary). How long one compile takes varies with the machine and with
    what the process compiled before, so a test that needs a compile refused compiles it over
    and over (`compiling_until_released`) rather than counting on one compile being slow."""
    return {"type": "object", "properties": {
        f"p{i}": {"type": "string", "pattern": rf"([{letters}]{{1,9}}\.){{1,100}}"}
        for i in range(properties)}, "required": [f"p{i}" for i in range(properties)]}


SLOW = slow_schema()


TENANT = "tenant-a"


def checker(timeout_s: float, max_wait_s: float = 60, per_tenant: int = 1) -> GrammarCheck:
    return GrammarCheck(xgr.TokenizerInfo(VOCAB, stop_token_ids=[len(VOCAB) - 1]), timeout_s,
                        max_wait_s, CheckPool(2, per_tenant, "grammar-test"))


class Compiling:
    """What `compiling_until_released` lets a test see: `began` is set on the loop as soon as a
    compile begins in its thread."""

    def __init__(self) -> None:
        self.began = asyncio.Event()
        self.release = threading.Event()
        self.ended: list[threading.Event] = []


@asynccontextmanager
async def compiling_until_released(check: GrammarCheck) -> AsyncIterator[Compiling]:
    """Inside the block, each of `check`'s compiles compiles its grammar again and again until
    the block ends: real compile work that spends CPU time and never ends on its own, so only
    the CPU limit can answer it, however fast this machine compiles the grammar once (a compile
    that ended between the limit's polls passed and failed the test). On leaving, the compiles
    are let go and their threads awaited."""
    compiling = Compiling()
    loop = asyncio.get_running_loop()
    original = check._compile

    def compile_until_released(kind: GrammarKind, text: str) -> None:
        ended = threading.Event()
        compiling.ended.append(ended)
        loop.call_soon_threadsafe(compiling.began.set)
        # The deadline only keeps a broken test from compiling for ever; nothing asserts on it.
        give_up = time.monotonic() + 60
        try:
            original(kind, text)
            while not compiling.release.is_set() and time.monotonic() < give_up:
                original(kind, text)
        finally:
            ended.set()

    check._compile = compile_until_released  # type: ignore[method-assign]
    try:
        yield compiling
    finally:
        compiling.release.set()
        for ended in list(compiling.ended):
            await asyncio.to_thread(ended.wait, 60)


async def test_a_quick_grammar_passes_and_is_remembered() -> None:
    check = checker(30)
    await check.check(SIMPLE, TENANT)
    assert len(check._verdicts) == 1
    compiles: list[str] = []
    original = check._compile
    check._compile = lambda kind, text: compiles.append(kind) or original(kind, text)  # type: ignore[method-assign]
    await check.check(dict(reversed(list(SIMPLE.items()))), TENANT)  # same schema, other key order
    assert compiles == [] and len(check._verdicts) == 1


@pytest.mark.timeout(120)
async def test_a_slow_grammar_is_refused_at_the_limit_without_blocking_the_loop() -> None:
    """The compile runs in a check thread: the loop hears that it began while it goes on, and
    the CPU limit refuses it while it still runs (it never ends on its own here)."""
    check = checker(0.05)
    async with compiling_until_released(check) as compiling:
        checked = asyncio.ensure_future(check.check(SLOW, TENANT))
        # A compile on the loop itself would hold the loop until the compiles were let go.
        # The bounds on these waits only keep a broken check from hanging the run.
        await asyncio.wait_for(compiling.began.wait(), 30)
        with pytest.raises(GrammarTooSlow, match="CPU time"):
            await asyncio.wait_for(checked, 30)
        assert not compiling.ended[0].is_set()  # refused while its compile still ran
    assert [fast for _, _, fast in check._verdicts.items()] == [False]


@pytest.mark.timeout(120)
async def test_a_check_waiting_for_a_thread_is_refused_at_the_wait_cap() -> None:
    """Both check threads held (say by refused slow compiles that go on): a new schema gets no
    CPU at all, and is refused at `max_wait_s` rather than held."""
    check = checker(30, max_wait_s=0.3, per_tenant=2)
    release = threading.Event()
    holding = [threading.Event() for _ in range(2)]

    def holder(i: int) -> Callable[[], bool]:
        def hold() -> bool:
            holding[i].set()
            return release.wait(60)  # set only once the verdict is in
        return hold

    held = [asyncio.ensure_future(check.pool.run(TENANT, i, holder(i), 60, 60)) for i in range(2)]
    compiles: list[str] = []

    def record(kind: GrammarKind, text: str) -> None:
        compiles.append(kind)

    check._compile = record  # type: ignore[method-assign]
    try:
        # Both threads are held before the check queues (bounded only against a broken pool).
        assert await asyncio.to_thread(lambda: all(h.wait(30) for h in holding))
        with pytest.raises(GrammarTooSlow, match="0.00 s of CPU time"):
            await asyncio.wait_for(check.check(SIMPLE, TENANT), 30)
        assert compiles == []  # refused without ever being compiled
        assert len(check._verdicts) == 0  # the wait's fault, not the schema's: not remembered
    finally:
        release.set()
        assert await asyncio.gather(*held) == [True, True]


async def test_a_schema_that_does_not_compile_is_left_to_the_engine() -> None:
    await checker(30).check({"type": "string", "format": "no-such-format", "minLength": 9,
                             "maxLength": 1}, TENANT)


async def test_the_served_bounded_whitespace_grammar_is_checked_too() -> None:
    """Forced calls are served the EBNF of app.formats.json_grammar by default: its compile is
    timed as well, and a slow one refused."""
    from app.formats.json_grammar import bounded_whitespace_grammar

    check = checker(30)
    await check.check_ebnf(bounded_whitespace_grammar(SIMPLE, 32), TENANT)
    assert len(check._verdicts) == 1
    slow, grammar = checker(0.05), bounded_whitespace_grammar(SLOW, 32)
    async with compiling_until_released(slow):
        with pytest.raises(GrammarTooSlow):
            await asyncio.wait_for(slow.check_ebnf(grammar, TENANT), 30)
    assert slow._verdicts.items() == [(TENANT, ("ebnf", grammar), False)]


async def test_a_refused_grammar_is_refused_at_once_the_next_time() -> None:
    """The verdict is about the schema: the same tenant's next request with it is refused
    without compiling it again (the first compile may still be running in its thread)."""
    check = checker(0.05)
    async with compiling_until_released(check) as compiling:
        with pytest.raises(GrammarTooSlow):
            await asyncio.wait_for(check.check(SLOW, TENANT), 30)
        with pytest.raises(GrammarTooSlow, match="refused before"):
            await check.check(SLOW, TENANT)
        assert len(compiling.ended) == 1  # the second request compiled nothing


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
    assert [(t, key) for t, key, _ in check._verdicts.items()] == [(TENANT, ("regex",
                                                                            "[a-z]{1,5}"))]


async def test_one_tenants_new_schemas_never_evict_another_tenants_verdicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The verdict cache has a share per tenant (app/tenancy.py `TenantLru`): a tenant sending
    schema after new schema evicts its own verdicts, not another tenant's (issue 39)."""
    monkeypatch.setattr(grammar_check, "_REMEMBERED_PER_TENANT", 2)
    monkeypatch.setattr(grammar_check, "_REMEMBERED", 4)
    check = checker(30)
    await check.check_text("regex", "[a-z]{1,3}", "tenant-b")
    for width in range(2, 8):
        await check.check_text("regex", f"[0-9]{{1,{width}}}", TENANT)
    assert check._verdicts.held(TENANT) == 2 and check._verdicts.held("tenant-b") == 1
    compiles: list[str] = []
    original = check._compile
    check._compile = lambda kind, text: compiles.append(text) or original(kind, text)  # type: ignore[method-assign]
    await check.check_text("regex", "[a-z]{1,3}", "tenant-b")
    assert compiles == []  # still remembered: not compiled again
