"""Whether the router calls the sidecar for a request, given the calls it already has pending.

A sidecar prediction helps only if it reaches the main model before the main model has
written the call itself. On a CPU sidecar the predictions of concurrent requests share one
core, so each takes longer the more are pending, while the main model (its own core) keeps
decoding: measured on the CPU default at 4 and 16 users, most predictions arrived late
(docs/benchmarks.md, "Under load") and their compute was lost. Past `limit` pending calls
the router skips the sidecar; the main model still drafts from the tool schemas and prompt
lookup.

One gate per router replica, used on its event loop only (no lock needed): it counts this
replica's own pending calls, the sidecar's queue as far as this router can see it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class SidecarGate:
    limit: int | None  # None: always call the sidecar
    pending: int = 0
    skipped: int = 0  # requests that went without the sidecar (for logs and tests)

    def admit(self) -> Callable[[], None] | None:
        """A release function when the call may go ahead (call it once the prediction has
        arrived or the turn has ended, whichever comes first; later calls do nothing), else
        None: skip the sidecar for this request.

        >>> gate = SidecarGate(limit=1)
        >>> release = gate.admit()
        >>> gate.admit() is None
        True
        >>> release(); release(); gate.pending
        0
        """
        if self.limit is not None and self.pending >= self.limit:
            self.skipped += 1
            return None
        self.pending += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.pending -= 1

        return release
