"""Work limited by the CPU time it spends, not the time it waits (app.cpu_budget)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.cpu_budget import OverBudget, over_budget, run_with_cpu_budget, thread_cpu_reader
from tests.unit.loop_ticks import loop_ticks


def spin(seconds: float) -> int:
    """Burn `seconds` of the calling thread's CPU time."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += 1
    return n


@pytest.mark.parametrize(("cpu_s", "waited_s", "expected"), [
    (0.0, 0.0, False),
    (4.9, 59.0, False),  # starved: little CPU over a long wait is not the work's fault
    (5.0, 5.0, True),    # spent its CPU time
    (0.0, 60.0, True),   # the wait's cap, whatever the CPU
])
def test_over_budget(cpu_s: float, waited_s: float, expected: bool) -> None:
    assert over_budget(cpu_s, waited_s, cpu_limit_s=5.0, max_wait_s=60.0) is expected


def test_the_reader_counts_the_threads_cpu_not_its_waiting() -> None:
    readers: dict[str, float] = {}

    def measure(name: str, work: float) -> None:
        read = thread_cpu_reader()
        if name == "sleeper":
            time.sleep(work)
        else:
            spin(work)
        readers[name] = read()

    threads = [threading.Thread(target=measure, args=("sleeper", 0.3)),
               threading.Thread(target=measure, args=("spinner", 0.3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert readers["sleeper"] < 0.05
    assert 0.29 < readers["spinner"] < 1


def test_the_reader_is_read_from_another_thread_while_the_work_runs() -> None:
    """The work spends 0.1 s of CPU by its own reading and then waits without CPU: read from
    outside meanwhile, the reader says what it spent (no clock: a loaded machine gives the
    thread its CPU later, not less of it)."""
    handed: list = []
    spent, release = threading.Event(), threading.Event()

    def work() -> None:
        reader = thread_cpu_reader()
        handed.append(reader)
        while reader() < 0.1:
            pass
        spent.set()
        release.wait(30)

    thread = threading.Thread(target=work)
    thread.start()
    assert spent.wait(60)
    seen = handed[0]()
    release.set()
    thread.join()
    assert 0.1 <= seen < 1  # its CPU so far, as the waiting side reads it


async def test_work_that_waits_without_cpu_is_not_refused() -> None:
    """The bug this module fixes: a thread that gets no CPU (a loaded machine; here a sleep)
    for longer than the limit is not over its budget."""
    assert await run_with_cpu_budget(lambda: time.sleep(0.5) or 7, 0.1, 30) == 7


async def test_work_that_spends_its_cpu_is_refused_soon_after() -> None:
    release = threading.Event()

    def work() -> None:
        end = time.monotonic() + 30
        while not release.is_set() and time.monotonic() < end:
            pass

    started = time.monotonic()
    with pytest.raises(OverBudget) as caught:
        await run_with_cpu_budget(work, 0.2, 30)
    release.set()
    assert caught.value.cpu_s >= 0.2
    assert time.monotonic() - started < 10


async def test_work_that_never_starts_is_refused_at_the_wait_cap_and_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as busy:
        busy.submit(release.wait, 10)
        with pytest.raises(OverBudget) as caught:
            await run_with_cpu_budget(lambda: ran.append("refused"), 5, 0.3, busy)
        waiting = asyncio.ensure_future(run_with_cpu_budget(lambda: ran.append("abandoned"),
                                                            5, 30, busy))
        await asyncio.sleep(0.1)
        waiting.cancel()  # the request went away while its check was queued
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
    assert caught.value.cpu_s == 0 and caught.value.waited_s >= 0.3
    assert ran == []  # the pool has shut down: what was queued would have run by now


async def test_the_loop_runs_while_the_work_runs_and_errors_come_through() -> None:
    async with loop_ticks() as ticks:
        assert await run_with_cpu_budget(lambda: spin(0.2), 5, 30) > 0
    assert ticks.count >= 5

    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await run_with_cpu_budget(fails, 5, 30)
