"""The replica's check pool (app.check_pool): bounded, shared, fair between tenants, and work
nobody waits for any more is not started. Work here blocks on events the test sets, so every
step is an event, not a clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from app.check_pool import Abandoned, CheckPool, PoolState, stop_if_abandoned
from app.cpu_budget import OverBudget

LONG = 30.0  # CPU and wait limits no test reaches unless it means to


class Gate:
    """Work that records its start and then waits until the test opens it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.started = threading.Event()
        self.open = threading.Event()

    def __call__(self) -> str:
        self.log.append(self.name)
        self.started.set()
        assert self.open.wait(LONG)
        return self.name


async def started(gate: Gate) -> None:
    assert await asyncio.to_thread(gate.started.wait, LONG)


async def state_becomes(pool: CheckPool, wanted: Callable[[PoolState], bool]) -> PoolState:
    """The pool's state once `wanted` holds (its threads update it as they finish)."""
    done = threading.Event()
    while not wanted(pool.state()):
        await asyncio.to_thread(done.wait, 0.01)  # yield to the pool's threads, then look again
    return pool.state()


async def test_identical_work_in_flight_runs_once() -> None:
    pool = CheckPool(2, 2, "test")
    log: list[str] = []
    gate = Gate("a", log)
    first = asyncio.ensure_future(pool.run("t", "k", gate, LONG, LONG))
    await started(gate)
    others = [asyncio.ensure_future(pool.run("t", "k", Gate("again", log), LONG, LONG))
              for _ in range(7)]
    # All seven have joined the running work (its count of waiting requests) before it ends;
    # each joins in its first step, so a turn of the loop does it (the bound is on turns).
    for _ in range(10_000):
        work = pool._work.get(("t", "k"))
        if work is not None and work.waiters == 8:
            break
        await asyncio.sleep(0)
    gate.open.set()
    assert await asyncio.gather(first, *others) == ["a"] * 8
    assert log == ["a"]


async def test_the_same_key_is_not_shared_between_tenants() -> None:
    pool = CheckPool(2, 1, "test")
    log: list[str] = []
    a, b = Gate("a", log), Gate("b", log)
    runs = [asyncio.ensure_future(pool.run("A", "k", a, LONG, LONG)),
            asyncio.ensure_future(pool.run("B", "k", b, LONG, LONG))]
    await started(a)
    await started(b)
    a.open.set()
    b.open.set()
    assert await asyncio.gather(*runs) == ["a", "b"]


async def test_one_tenant_holds_at_most_its_share_and_the_other_is_served() -> None:
    pool = CheckPool(2, 1, "test")
    log: list[str] = []
    slow = [Gate(f"a{i}", log) for i in range(4)]
    flood = [asyncio.ensure_future(pool.run("A", f"k{i}", g, LONG, LONG))
             for i, g in enumerate(slow)]
    await started(slow[0])
    assert pool.state() == PoolState(running={"A": 1}, queued={"A": 3})
    quick = Gate("b", log)
    quick.open.set()
    # Tenant B's check is answered while every one of A's is still held or queued.
    assert await pool.run("B", "k", quick, LONG, LONG) == "b"
    assert log == ["a0", "b"]
    for gate in slow:
        gate.open.set()
    assert await asyncio.gather(*flood) == ["a0", "a1", "a2", "a3"]


async def test_queued_work_is_served_round_robin_over_tenants() -> None:
    pool = CheckPool(1, 1, "test")
    log: list[str] = []
    gates = {name: Gate(name, log) for name in ("a0", "a1", "a2", "b0", "c0")}
    runs = [asyncio.ensure_future(pool.run("A", "a0", gates["a0"], LONG, LONG))]
    await started(gates["a0"])
    for name in ("a1", "a2", "b0", "c0"):
        runs.append(asyncio.ensure_future(pool.run(name[0].upper(), name, gates[name],
                                                   LONG, LONG)))
    await state_becomes(pool, lambda s: sum(s.queued.values()) == 4)
    for gate in gates.values():
        gate.open.set()
    await asyncio.gather(*runs)
    # A's work was queued first, yet B and C, whose work has not run yet, come first.
    assert log == ["a0", "b0", "c0", "a1", "a2"]


async def test_work_nobody_waits_for_is_not_started() -> None:
    pool = CheckPool(1, 1, "test")
    log: list[str] = []
    busy = Gate("busy", log)
    running = asyncio.ensure_future(pool.run("A", "busy", busy, LONG, LONG))
    await started(busy)
    abandoned = asyncio.ensure_future(pool.run("B", "k", Gate("abandoned", log), LONG, LONG))
    with pytest.raises(OverBudget):  # refused at its wait's cap, before any thread was free
        await pool.run("C", "k", Gate("refused", log), LONG, 0.2)
    await state_becomes(pool, lambda s: s.queued == {"B": 1})
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    assert pool.state() == PoolState(running={"A": 1}, queued={})
    busy.open.set()
    assert await running == "busy"
    after = Gate("after", log)
    after.open.set()
    assert await pool.run("B", "k", after, LONG, LONG) == "after"
    assert log == ["busy", "after"]


async def test_shared_work_goes_on_while_someone_still_waits() -> None:
    pool = CheckPool(1, 1, "test")
    log: list[str] = []
    busy, shared = Gate("busy", log), Gate("shared", log)
    first = asyncio.ensure_future(pool.run("A", "busy", busy, LONG, LONG))
    await started(busy)
    leaving = asyncio.ensure_future(pool.run("B", "k", shared, LONG, LONG))
    staying = asyncio.ensure_future(pool.run("B", "k", shared, LONG, LONG))
    await state_becomes(pool, lambda s: s.queued == {"B": 1})
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    busy.open.set()
    shared.open.set()
    assert await staying == "shared" and await first == "busy"


async def test_refused_work_keeps_its_tenants_share_until_it_ends() -> None:
    """A thread cannot be stopped: work refused for its CPU time runs on, and the slot
    accounting says so. Its tenant's next work waits; another tenant's does not, and a request
    for the same work is refused at once (the work has already spent the limit)."""
    pool = CheckPool(2, 1, "test")
    stop = threading.Event()

    def spin() -> str:
        while not stop.is_set():
            pass
        return "spun"

    with pytest.raises(OverBudget) as refused:
        await pool.run("A", "slow", spin, 0.05, LONG)
    assert refused.value.cpu_s >= 0.05
    assert pool.state().running == {"A": 1}
    with pytest.raises(OverBudget):
        await pool.run("A", "slow", spin, 0.05, LONG)
    log: list[str] = []
    next_a, other = Gate("a", log), Gate("b", log)
    other.open.set()
    waiting = asyncio.ensure_future(pool.run("A", "next", next_a, LONG, LONG))
    assert await pool.run("B", "k", other, LONG, LONG) == "b"
    assert log == ["b"]
    assert await state_becomes(pool, lambda s: "B" not in s.running) == PoolState(
        running={"A": 1}, queued={"A": 1})
    stop.set()
    await started(next_a)
    next_a.open.set()
    assert await waiting == "a"
    assert await state_becomes(pool, lambda s: not s.running) == PoolState({}, {})


async def test_a_failure_reaches_every_waiter() -> None:
    pool = CheckPool(1, 1, "test")

    def broken() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await pool.run("A", "k", broken, LONG, LONG)


def test_the_share_must_fit_the_pool() -> None:
    with pytest.raises(ValueError):
        CheckPool(2, 3, "test")


async def test_closing_waits_for_running_work_and_starts_no_more() -> None:
    pool = CheckPool(1, 1, "test")
    log: list[str] = []
    running, queued = Gate("running", log), Gate("queued", log)
    first = asyncio.ensure_future(pool.run("A", "a", running, LONG, LONG))
    await started(running)
    never = asyncio.ensure_future(pool.run("B", "b", queued, LONG, LONG))
    await state_becomes(pool, lambda s: s.queued == {"B": 1})
    closing = asyncio.ensure_future(asyncio.to_thread(pool.close))
    await state_becomes(pool, lambda s: s.closed)
    running.open.set()
    await closing
    assert await first == "running" and log == ["running"]
    never.cancel()


async def test_refused_work_that_checks_in_stops_at_its_next_step_and_frees_its_share() -> None:
    """Work that calls `stop_if_abandoned` between its steps (the router's request checks, between
    schemas) ends once every request has left it, instead of running to its end: its thread and
    its tenant's share are free again for the tenant's next work."""
    pool = CheckPool(1, 1, "test")
    stopped = threading.Event()
    steps = 0

    def steps_until_stopped() -> str:
        nonlocal steps
        try:
            while True:  # each pass one step (one schema); never ends on its own
                steps += 1
                stop_if_abandoned()
        except Abandoned:
            stopped.set()
            raise

    with pytest.raises(OverBudget):
        await pool.run("A", "slow", steps_until_stopped, 0.05, LONG)
    assert await asyncio.to_thread(stopped.wait, LONG)
    log: list[str] = []
    after = Gate("after", log)
    after.open.set()
    assert await pool.run("A", "next", after, LONG, LONG) == "after"
    assert await state_becomes(pool, lambda s: not s.running) == PoolState({}, {})
    stop_if_abandoned()  # outside a pool's thread: nothing to stop
