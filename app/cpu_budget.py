"""Work in a worker thread, limited by the CPU time it spends rather than the time it waits.

A limit on wall-clock time refuses ordinary work whenever the machine is busy: in a test run on
a loaded 2-core machine, a forced call whose grammar compiles in 9 ms of CPU was refused at the
5 s limit, and the client was told to simplify its schema. What a request's schema costs is the CPU
its check spends, so that is what is limited. A cap on the wall-clock wait (`max_wait_s`) still
bounds how long a request is held, whether the check runs slowly or has not started yet (every
worker busy).

The thread's CPU time is read from outside, while the work runs, through its POSIX CPU-time
clock; where threads have none (not Linux or a BSD), the thread's wall time since it started
the work stands in, which is the old wall-clock limit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")

# How often the waiting side reads the thread's clock; a check that ends sooner returns at once.
_POLL_S = 0.05


class OverBudget(Exception):
    """The work spent its CPU time, or the wait reached its cap, before it ended. The work
    itself goes on in its thread (a thread cannot be interrupted); the callers' own caps bound
    how long."""

    def __init__(self, cpu_s: float, waited_s: float) -> None:
        super().__init__(f"{cpu_s:.2f} s of CPU time in {waited_s:.2f} s")
        self.cpu_s = cpu_s
        self.waited_s = waited_s


def over_budget(cpu_s: float, waited_s: float, cpu_limit_s: float, max_wait_s: float) -> bool:
    return cpu_s >= cpu_limit_s or waited_s >= max_wait_s


def thread_cpu_reader() -> Callable[[], float]:
    """Seconds of CPU time the calling thread spends from now on, readable from any thread
    while the calling thread lives."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        start = time.clock_gettime(clock)
    except (AttributeError, OSError):  # no per-thread CPU clocks here: wall time instead
        begun = time.monotonic()
        return lambda: time.monotonic() - begun
    return lambda: time.clock_gettime(clock) - start


class CpuMeter:
    """The CPU time of one piece of work in its worker thread; 0 until the work starts, fixed
    when it ends (the thread then goes on to other work). `start` and `stop` run in the worker
    thread, `cpu_s` anywhere."""

    def __init__(self) -> None:
        self._read: Callable[[], float] | None = None
        self._spent: float | None = None

    def start(self) -> None:
        self._read = thread_cpu_reader()

    def stop(self) -> None:
        if self._read is not None:
            self._spent = self._read()

    def cpu_s(self) -> float:
        if self._spent is not None:
            return self._spent
        return self._read() if self._read is not None else 0.0


async def run_with_cpu_budget(
    work: Callable[[], T],
    cpu_limit_s: float,
    max_wait_s: float,
    executor: Executor | None = None,
) -> T:
    """`work()` in a thread of `executor` (the loop's default one if None); `OverBudget` once it
    has spent `cpu_limit_s` of CPU time, or `max_wait_s` have passed, without ending."""
    loop = asyncio.get_running_loop()
    meter = CpuMeter()

    def metered() -> T:
        meter.start()
        try:
            return work()
        finally:
            meter.stop()

    future = loop.run_in_executor(executor, metered)
    started = loop.time()
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=_POLL_S)
            if done:
                return future.result()
            cpu_s, waited_s = meter.cpu_s(), loop.time() - started
            if over_budget(cpu_s, waited_s, cpu_limit_s, max_wait_s):
                raise OverBudget(cpu_s, waited_s)
    finally:
        # Refused or abandoned (the request cancelled): work still queued never runs; work
        # that has started goes on, as a thread cannot be stopped.
        future.cancel()
