"""Fault injection for the degradation tests: a sidecar that hangs, fails or answers garbage,
a tool worker that hangs or fails.

Faults are armed on a replica through a Ray handle method of its deployment (never an HTTP
route), and only when the config's `faults.enabled` is true, which no shipped config sets. A
replica's `FaultPlan` holds at most one fault, which expires after its duration so a test that
dies half-way cannot leave the app broken. The deployments ask `active()` at the top of the
method under test; everything here is pure (the clock is injectable).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any

from app.speculation.prediction import PredictedCall, Prediction

# "slow": the sidecar first runs a long generation of its own, so its engine is busy.
SIDECAR_FAULTS = frozenset({"hang", "slow", "error", "garbage", "wrong_call"})
TOOL_WORKER_FAULTS = frozenset({"hang", "error"})
MAX_FAULT_S = 600.0


class FaultInjectionDisabled(RuntimeError):
    pass


class FaultPlan:
    def __init__(
        self,
        enabled: bool,
        kinds: Collection[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.kinds = frozenset(kinds)
        self._clock = clock
        self._kind: str | None = None
        self._until = 0.0
        self.hits = 0  # calls that met the armed fault
        self.waiting = 0  # calls inside a hang right now

    def arm(self, kind: str, seconds: float = 60.0) -> None:
        if not self.enabled:
            raise FaultInjectionDisabled(
                "fault injection is off (set `faults.enabled: true` in a test config)"
            )
        if kind not in self.kinds:
            raise ValueError(f"unknown fault {kind!r}; this replica knows {sorted(self.kinds)}")
        if not 0 < seconds <= MAX_FAULT_S:
            raise ValueError(f"a fault lasts between 0 and {MAX_FAULT_S:g} s, not {seconds}")
        self._kind = kind
        self._until = self._clock() + seconds
        self.hits = 0

    def clear(self) -> None:
        self._kind = None

    def active(self) -> str | None:
        """The armed fault, or None once cleared or expired."""
        if self._kind is not None and self._clock() >= self._until:
            self._kind = None
        return self._kind

    def hit(self) -> str | None:
        """`active()`, counting the call when a fault is armed."""
        kind = self.active()
        if kind is not None:
            self.hits += 1
        return kind

    async def hang(self) -> None:
        """Hold the call while the `hang` fault is armed (counted in `waiting`)."""
        self.waiting += 1
        try:
            while self.active() == "hang":
                await asyncio.sleep(0.1)
        finally:
            self.waiting -= 1

    def status(self) -> dict[str, Any]:
        kind = self.active()
        return {
            "kind": kind,
            "remaining_s": max(0.0, self._until - self._clock()) if kind else 0.0,
            "hits": self.hits,
            "waiting": self.waiting,
        }


def garbage_prediction() -> dict[str, Any]:
    """What a broken sidecar might send: not a `Prediction` at all."""
    return {"candidates": "<tool_call>{not json", "elapsed_ms": "soon", "source": "oracle"}


def wrong_prediction(tools: list[dict[str, Any]]) -> Prediction:
    """A well-formed prediction that is wrong: the first tool, each required argument set to a
    value of its type that no sensible model would pick. It validates, so the main model
    drafts from it and must reject every wrong token itself."""
    if not tools:
        return Prediction(no_call=True)
    function = tools[0]["function"]
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    arguments = {key: _unlikely_value(properties.get(key) or {})
                 for key in schema.get("required") or []}
    return Prediction(candidates=[[PredictedCall(name=function["name"], arguments=arguments)]])


def _unlikely_value(schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][-1]
    kind = schema.get("type")
    if kind == "integer":
        return 7_654_321
    if kind == "number":
        return 7654.321
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return "zq-wrong-guess-zq"
