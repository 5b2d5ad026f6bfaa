"""Work limited by the CPU time it spends, not the time it waits (app.cpu_budget)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.cpu_budget import OverBudget, over_budget, run_with_cpu_budget, thread_cpu_reader


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


async def test_work_that_spends_its_cpu_is_refused_while_it_runs() -> None:
    """The work spins until the test lets it go: only the CPU limit can answer it."""
    release, ended = threading.Event(), threading.Event()

    def work() -> None:
        # The deadline only keeps a broken budget from spinning for ever; nothing asserts on it.
        give_up = time.monotonic() + 60
        while not release.is_set() and time.monotonic() < give_up:
            pass
        ended.set()

    try:
        with pytest.raises(OverBudget) as caught:
            await run_with_cpu_budget(work, 0.2, 60)
        assert not ended.is_set()  # refused while the work still ran
    finally:
        release.set()
    assert caught.value.cpu_s >= 0.2


class _SignallingExecutor(ThreadPoolExecutor):
    """A thread pool that tells the loop when work has been handed to it."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers)
        self.submitted = 0
        self.more = asyncio.Event()

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        future = super().submit(fn, *args, **kwargs)
        self.submitted += 1
        self.more.set()
        return future

    async def wait_for_submitted(self, count: int) -> None:
        while self.submitted < count:
            self.more.clear()
            await self.more.wait()


async def test_work_that_never_starts_is_refused_at_the_wait_cap_and_never_runs() -> None:
    release, holding = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        holding.set()
        release.wait(60)  # set once the verdicts are in

    with _SignallingExecutor(max_workers=1) as busy:
        try:
            busy.submit(hold)
            assert await asyncio.to_thread(holding.wait, 30)  # its one thread is taken
            with pytest.raises(OverBudget) as caught:
                await asyncio.wait_for(
                    run_with_cpu_budget(lambda: ran.append("refused"), 5, 0.3, busy), 30)
            waiting = asyncio.ensure_future(
                run_with_cpu_budget(lambda: ran.append("abandoned"), 5, 30, busy))
            await asyncio.wait_for(busy.wait_for_submitted(3), 30)  # queued behind the hold
            waiting.cancel()  # the request went away while its check was queued
            with pytest.raises(asyncio.CancelledError):
                await waiting
        finally:
            release.set()
    assert caught.value.cpu_s == 0 and caught.value.waited_s >= 0.3
    assert ran == []  # the pool has shut down: what was queued would have run by now


async def test_the_loop_runs_while_the_work_runs_and_errors_come_through() -> None:
    """The work spins (holding the GIL in turns) until the loop has answered it: it ends only
    if the loop ran while it was running."""
    loop = asyncio.get_running_loop()
    began, loop_ran = asyncio.Event(), threading.Event()

    def work() -> bool:
        loop.call_soon_threadsafe(began.set)
        # The deadline only keeps work run on the loop itself from spinning for ever.
        give_up = time.monotonic() + 60
        while not loop_ran.is_set() and time.monotonic() < give_up:
            pass
        return loop_ran.is_set()

    async def answer() -> None:
        await began.wait()
        loop_ran.set()

    answered, _ = await asyncio.gather(run_with_cpu_budget(work, 30, 120), answer())
    assert answered is True

    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await run_with_cpu_budget(fails, 5, 30)
