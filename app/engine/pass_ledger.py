"""The forward passes one piece of work took part in, counted for that work alone.

An engine's own counter (`VllmEngine.passes`) counts every pass, whoever's requests it carried:
its difference over a prediction's life would include other tenants' work, and a client shown
it could read how busy the sidecar is with others. Each `StepDelta` says which pass produced it
(`pass_index`); a `PassLedger` made current with `count_passes` collects the passes in which the
engine requests made in its context wrote tokens (tasks started inside share it, since they
copy the context), so a prediction reports only the passes its own requests were in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class PassLedger:
    """Distinct passes: requests of one prediction that share a pass (slots filled in parallel)
    count it once, so the count is the prediction's critical path in passes."""

    def __init__(self) -> None:
        self._passes: set[int] = set()

    def add(self, pass_index: int) -> None:
        self._passes.add(pass_index)

    def __len__(self) -> int:
        return len(self._passes)


_CURRENT: ContextVar[PassLedger | None] = ContextVar("ooo_spec_pass_ledger", default=None)


@contextmanager
def count_passes() -> Iterator[PassLedger]:
    """Make a fresh ledger current for the block; read its length afterwards."""
    ledger = PassLedger()
    token = _CURRENT.set(ledger)
    try:
        yield ledger
    finally:
        _CURRENT.reset(token)


def record_pass(pass_index: int) -> None:
    """An engine request of the current context wrote tokens in pass `pass_index`."""
    ledger = _CURRENT.get()
    if ledger is not None:
        ledger.add(pass_index)
