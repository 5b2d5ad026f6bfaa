"""One stream of a turn's events with a side task's result put in as soon as it is there.

The main replica starts the turn's sidecar call beside its own prefill (deployments/
main_model.py), and the router needs the call's `ObjectRef` as soon as it exists, to pre-execute
the predicted calls while the main model decodes; waiting for the next engine event would hold
it back by a whole prefill. So the stream is consumed one event ahead, in its own task, while
the side task is awaited beside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

_E = TypeVar("_E")
_S = TypeVar("_S")
_A = TypeVar("_A")


async def with_side_result(
    events: AsyncIterator[_E], side: asyncio.Future[_S], announce: Callable[[_S], _A]
) -> AsyncIterator[_E | _A]:
    """`events` in order, with `announce(side's result)` yielded once, as soon as `side` has
    finished (before the next event if both are there). A `side` that failed or was cancelled
    announces nothing (its owner reports it); `events`' own errors pass through unchanged.
    Closing the stream early closes `events` too."""
    pending: asyncio.Future[_E] | None = None
    announced = False
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(events))
            if not announced:
                both: set[asyncio.Future[Any]] = {pending, side}
                await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
                if side.done():
                    announced = True
                    if not side.cancelled() and side.exception() is None:
                        yield announce(side.result())
                    continue
            try:
                event = await pending
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        closing = getattr(events, "aclose", None)
        if closing is not None:
            await closing()


async def _next(events: AsyncIterator[_E]) -> _E:
    return await anext(events)
