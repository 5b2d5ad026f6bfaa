"""A replica's CPU-heavy checks (grammar compiles, schema checks) in a small pool of its own:
bounded, shared between identical requests, and fair between tenants.

Why not the loop's default executor: it has many threads and no notion of whose work it runs,
so one client's slow schemas (a grammar of long bounded strings compiles for tens of seconds)
take every thread and everyone else's forced calls wait behind them. Here:

- **Bounded.** `workers` threads per pool, started once.
- **Shared.** Work is named by `(tenant, key)`: a request that asks for work already queued or
  running joins it instead of adding its own (`n: 8` compiles its grammar once). Keys are kept
  per tenant, so how fast a check answers says nothing about other tenants' schemas.
- **Fair.** A tenant runs at most `per_tenant` pieces of work at once, and a free thread takes
  the next work of the tenant whose work started least recently (round-robin over the tenants
  with work waiting), so one tenant's backlog never stands in front of another's next check.
- **Not started when nobody waits.** Each request that joined a piece of work leaves it when it
  has its answer, is refused (`OverBudget`: the CPU-time limit of app/cpu_budget.py, or its
  wait's cap) or is cancelled; queued work that every request has left is dropped unstarted.
- **Honest about what cannot be stopped.** A Python thread cannot be interrupted, and a grammar
  compile has no cancellation point: work that was refused while running runs to its end. It
  keeps its thread, and its tenant's share, until then (`running`), so a tenant whose compiles
  were refused waits behind them itself, and never holds more than `per_tenant` threads; the
  schema caps (app.api.limits) bound how long such work can run. Work that checks in between
  its steps (`stop_if_abandoned`, as the router's request checks do between schemas) stops at
  its next step once every request has left it, and frees its thread then.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.cpu_budget import CpuMeter, OverBudget, over_budget

T = TypeVar("T")

# How often a waiting request reads its work's CPU clock; work that ends sooner answers at once.
_POLL_S = 0.05


@dataclass(eq=False)
class _Work(Generic[T]):
    tenant: str
    key: Hashable
    run: Callable[[], T]
    result: Future[T] = field(default_factory=Future)
    meter: CpuMeter = field(default_factory=CpuMeter)
    waiters: int = 0
    started: bool = False
    # Every request left it while it ran: `stop_if_abandoned` ends it at its next step.
    abandoned: bool = False


class Abandoned(BaseException):
    """Raised inside pooled work by `stop_if_abandoned`: nobody waits for its result."""


# The work the calling pool thread runs (unset outside a pool's threads).
_current = threading.local()


def stop_if_abandoned() -> None:
    """Called by pooled work between its steps: raises `Abandoned` once every request that
    waited for the work has left it (refused past its budget, or cancelled), so refused work
    stops at its next step rather than running to its end. A no-op outside a pool's thread."""
    work = getattr(_current, "work", None)
    if work is not None and work.abandoned:
        raise Abandoned()


@dataclass(frozen=True)
class PoolState:
    """What the pool holds now: work per tenant, running (refused work still running
    included) and queued."""

    running: dict[str, int]
    queued: dict[str, int]
    closed: bool = False


def pick_tenant(queued: Iterable[str], running: Mapping[str, int],
                last_started: Mapping[str, int], per_tenant: int) -> str | None:
    """Of the tenants with work `queued`, the one below its share whose work started least
    recently (never: first), ties in queue order.

    >>> pick_tenant(["a", "b"], {"a": 1}, {"a": 7}, 1)
    'b'
    >>> pick_tenant(["a", "b"], {}, {"a": 7, "b": 3}, 2)
    'b'
    >>> pick_tenant(["a", "b"], {"a": 1, "b": 1}, {}, 1) is None
    True
    """
    eligible = [t for t in queued if running.get(t, 0) < per_tenant]
    return min(eligible, key=lambda t: last_started.get(t, -1), default=None)


class CheckPool:
    def __init__(self, workers: int, per_tenant: int, name: str) -> None:
        if workers < 1 or not 1 <= per_tenant <= workers:
            raise ValueError("a check pool needs 1 <= per_tenant <= workers")
        self.workers = workers
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Tenants with work queued, in round-robin order; each tenant's own queue in order.
        self._queued: OrderedDict[str, deque[_Work[Any]]] = OrderedDict()
        self._running: Counter[str] = Counter()
        # When each tenant with work queued or running last had work started (a count).
        self._last_started: dict[str, int] = {}
        self._starts = 0
        self._work: dict[tuple[str, Hashable], _Work[Any]] = {}  # queued or running
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()
        # At exit, work still running ends first: a process that exits while xgrammar compiles
        # in a daemon thread is aborted by the C++ runtime.
        atexit.register(self.close)

    def close(self) -> None:
        """Start nothing more; return once the work already running has ended."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    async def run(self, tenant: str, key: Hashable, work: Callable[[], T], cpu_limit_s: float,
                  max_wait_s: float) -> T:
        """`work()`'s result, computed once for every request of `tenant` that asks for `key`
        meanwhile; `OverBudget` once the work has spent `cpu_limit_s` of CPU time, or this
        request has waited `max_wait_s`, without an answer."""
        loop = asyncio.get_running_loop()
        shared = self._join(tenant, key, work)
        answer: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not answer.done():
                answer.set_result(None)

        def wake(_: Future[Any]) -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the waiting loop has closed: nobody to tell
                pass

        shared.result.add_done_callback(wake)
        started = loop.time()
        try:
            while True:
                done, _ = await asyncio.wait({answer}, timeout=_POLL_S)
                if done:
                    try:
                        result: T = shared.result.result()
                    except Abandoned:  # it stopped as this request joined: as refused
                        raise OverBudget(shared.meter.cpu_s(), loop.time() - started) from None
                    return result
                cpu_s, waited_s = shared.meter.cpu_s(), loop.time() - started
                if over_budget(cpu_s, waited_s, cpu_limit_s, max_wait_s):
                    raise OverBudget(cpu_s, waited_s)
        finally:
            self._leave(shared)

    def state(self) -> PoolState:
        with self._lock:
            return PoolState(running=dict(self._running),
                             queued={t: len(q) for t, q in self._queued.items()},
                             closed=self._closed)

    # ----- bookkeeping (under the lock) ------------------------------------------------
    def _join(self, tenant: str, key: Hashable, work: Callable[[], T]) -> _Work[T]:
        with self._lock:
            shared = self._work.get((tenant, key))
            if shared is None:
                shared = _Work(tenant, key, work)
                self._work[(tenant, key)] = shared
                self._queued.setdefault(tenant, deque()).append(shared)
                self._wake.notify()
            shared.waiters += 1
            shared.abandoned = False  # someone waits for it again
            return shared

    def _leave(self, shared: _Work[Any]) -> None:
        with self._lock:
            shared.waiters -= 1
            if shared.waiters or shared.result.done():
                return  # others wait for it
            if shared.started:
                # A thread cannot be stopped: the work runs until its next check-in
                # (`stop_if_abandoned`), or to its end.
                shared.abandoned = True
                return
            queue = self._queued.get(shared.tenant)
            if queue is not None and shared in queue:
                queue.remove(shared)
                if not queue:
                    del self._queued[shared.tenant]
            if self._work.get((shared.tenant, shared.key)) is shared:
                del self._work[(shared.tenant, shared.key)]
            if shared.tenant not in self._queued and not self._running[shared.tenant]:
                self._last_started.pop(shared.tenant, None)
            shared.result.cancel()

    def _next(self) -> _Work[Any] | None:
        tenant = pick_tenant(self._queued, self._running, self._last_started, self.per_tenant)
        if tenant is None:
            return None
        queue = self._queued[tenant]
        shared = queue.popleft()
        if not queue:
            del self._queued[tenant]
        shared.started = True
        self._running[tenant] += 1
        self._starts += 1
        self._last_started[tenant] = self._starts
        return shared

    # ----- worker threads --------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._wake:
                shared = None if self._closed else self._next()
                while shared is None:
                    if self._closed:
                        return
                    self._wake.wait()
                    shared = self._next()
            shared.meter.start()
            _current.work = shared
            try:
                value = shared.run()
            except BaseException as exc:  # noqa: BLE001 - the waiting requests get it
                shared.meter.stop()
                shared.result.set_exception(exc)
            else:
                shared.meter.stop()
                shared.result.set_result(value)
            finally:
                _current.work = None
            with self._wake:
                tenant = shared.tenant
                self._running[tenant] -= 1
                if not self._running[tenant]:
                    del self._running[tenant]
                    if tenant not in self._queued:  # idle: nothing more to remember of it
                        self._last_started.pop(tenant, None)
                if self._work.get((tenant, shared.key)) is shared:
                    del self._work[(tenant, shared.key)]
                # The tenant's share has room again: an idle thread may take its next work.
                self._wake.notify_all()
