"""How often the event loop ran while a test awaited something: work said to run off the loop
must leave it free."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Ticks:
    count = 0


@asynccontextmanager
async def loop_ticks(interval_s: float = 0.01) -> AsyncIterator[Ticks]:
    """Counts the loop's turns of `interval_s` inside the block."""
    ticks = Ticks()

    async def tick() -> None:
        while True:
            await asyncio.sleep(interval_s)
            ticks.count += 1

    task = asyncio.ensure_future(tick())
    try:
        yield ticks
    finally:
        task.cancel()
