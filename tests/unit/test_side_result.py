"""`with_side_result`: the sidecar's ref put into the main replica's stream as soon as it
exists, never later than it could be, never instead of an event, and nothing left running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.main_model.side_result import with_side_result


class Gated:
    """A stream whose events each wait for the test to let them out."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.gates = [asyncio.Event() for _ in events]
        self.waiting = [asyncio.Event() for _ in events]  # the stream waits at that gate
        self.closed = False

    async def stream(self) -> AsyncIterator[str]:
        try:
            for event, gate, waiting in zip(self.events, self.gates, self.waiting, strict=True):
                waiting.set()
                await gate.wait()
                yield event
        finally:
            self.closed = True


async def test_the_side_result_comes_out_before_an_event_that_is_still_waiting() -> None:
    """The prefill case: the stream's first event is far off, the ref is there at once."""
    gated = Gated(["a", "b"])
    side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out = with_side_result(gated.stream(), side, lambda ref: f"side:{ref}")
    first = asyncio.ensure_future(anext(out))
    await gated.waiting[0].wait()
    assert not first.done()
    side.set_result("r")
    # No event to wait for: what is checked is that `first` needs none. A bounded number of
    # turns of the loop (not of the clock), so a merge that waits for the gate fails, not hangs.
    for _ in range(20):
        await asyncio.sleep(0)
    assert first.done() and first.result() == "side:r"
    gated.gates[0].set()
    gated.gates[1].set()
    assert [e async for e in out] == ["a", "b"]
    assert gated.closed


async def test_the_side_result_comes_between_events_once() -> None:
    gated = Gated(["a", "b", "c"])
    side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out = with_side_result(gated.stream(), side, lambda ref: f"side:{ref}")
    gated.gates[0].set()
    assert await anext(out) == "a"
    side.set_result("r")
    gated.gates[1].set()
    gated.gates[2].set()
    assert [e async for e in out] == ["side:r", "b", "c"]


async def test_a_failed_or_cancelled_side_announces_nothing() -> None:
    for end in ("fail", "cancel"):
        gated = Gated(["a"])
        side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if end == "fail":
            side.set_exception(RuntimeError("no replica"))
        else:
            side.cancel()
        gated.gates[0].set()
        out = with_side_result(gated.stream(), side, lambda ref: f"side:{ref}")
        assert [e async for e in out] == ["a"], end


async def test_a_side_that_never_finishes_holds_nothing_back() -> None:
    gated = Gated(["a", "b"])
    side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    for gate in gated.gates:
        gate.set()
    out = with_side_result(gated.stream(), side, lambda ref: f"side:{ref}")
    assert [e async for e in out] == ["a", "b"]
    assert not side.done()


async def test_the_streams_error_passes_through() -> None:
    async def failing() -> AsyncIterator[str]:
        yield "a"
        raise ValueError("engine")

    side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out = with_side_result(failing(), side, lambda ref: ref)
    assert await anext(out) == "a"
    with pytest.raises(ValueError, match="engine"):
        await anext(out)


async def test_a_consumer_cancelled_midway_closes_the_stream_and_leaves_no_task() -> None:
    """A dropped client: the consumer is cancelled while the next event is still awaited."""
    gated = Gated(["a", "b"])
    side: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    out = with_side_result(gated.stream(), side, lambda ref: ref)
    gated.gates[0].set()
    assert await anext(out) == "a"
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(anext(out))
    await gated.waiting[1].wait()  # the next event's own task is running, at its gate
    assert len(asyncio.all_tasks()) == len(before) + 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await out.aclose()
    assert gated.closed
    assert asyncio.all_tasks() == before
