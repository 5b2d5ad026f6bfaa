"""Fault plans (app.faults): inert unless enabled, one fault at a time, always expiring."""

from __future__ import annotations

import pytest

from app.faults import (
    SIDECAR_FAULTS,
    FaultInjectionDisabled,
    FaultPlan,
    garbage_prediction,
    wrong_prediction,
)
from app.speculation.prediction import Prediction
from app.speculation.validation import validate_arguments


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_disabled_plan_refuses_to_arm() -> None:
    plan = FaultPlan(False, SIDECAR_FAULTS)
    with pytest.raises(FaultInjectionDisabled):
        plan.arm("hang")
    assert plan.hit() is None


def test_armed_fault_is_active_until_cleared_or_expired() -> None:
    clock = Clock()
    plan = FaultPlan(True, SIDECAR_FAULTS, clock)
    plan.arm("garbage", seconds=5)
    assert plan.hit() == "garbage" and plan.hit() == "garbage"
    assert plan.status() == {"kind": "garbage", "remaining_s": 5.0, "hits": 2, "waiting": 0}
    clock.now += 5
    assert plan.hit() is None and plan.status()["kind"] is None
    plan.arm("hang", seconds=60)
    plan.clear()
    assert plan.active() is None


def test_unknown_kinds_and_durations_are_refused() -> None:
    plan = FaultPlan(True, {"hang"})
    with pytest.raises(ValueError, match="unknown fault"):
        plan.arm("garbage")
    for seconds in (0, -1, 10_000):
        with pytest.raises(ValueError):
            plan.arm("hang", seconds)


def test_garbage_is_not_a_prediction() -> None:
    with pytest.raises(ValueError):
        Prediction.model_validate(garbage_prediction())


def test_wrong_prediction_validates_but_is_wrong() -> None:
    schema = {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]}, "note": {"type": "string"}},
        "required": ["city", "days", "unit"]}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": schema}}]
    prediction = wrong_prediction(tools)
    (call,) = prediction.candidates[0]
    assert call.name == "weather"
    assert set(call.arguments) == {"city", "days", "unit"}
    assert call.arguments["city"] != "Paris"
    assert validate_arguments(call.arguments, schema) == []
    assert wrong_prediction([]).no_call


async def test_hang_holds_the_call_until_the_fault_is_cleared() -> None:
    import asyncio

    class CountingClock(Clock):
        """A clock that stands still (the fault never expires) and counts its readings: each
        of the hang's checks of the fault reads it once."""

        def __init__(self) -> None:
            super().__init__()
            self.reads = 0
            self.more = asyncio.Event()

        def __call__(self) -> float:
            self.reads += 1
            self.more.set()
            return super().__call__()

    async def reads_reach(clock: CountingClock, count: int) -> None:
        while clock.reads < count:
            clock.more.clear()
            await clock.more.wait()

    clock = CountingClock()
    plan = FaultPlan(True, {"hang"}, clock)
    plan.arm("hang")  # one reading
    held = asyncio.ensure_future(plan.hang())
    # The hang checked the fault three times (on entry and after two of its polls), and holds
    # on (the bound is on waiting only).
    await asyncio.wait_for(reads_reach(clock, 4), 30)
    assert not held.done() and plan.waiting == 1
    plan.clear()
    await asyncio.wait_for(held, 30)
    assert plan.waiting == 0
