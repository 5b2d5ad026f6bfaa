"""A tool call runs in its tenant's context (app/tools/call_context.py), on the event loop and in
the tool thread alike, and one call's context never leaks into another's."""

from __future__ import annotations

import asyncio
import threading

from app.tenancy import ANONYMOUS_TENANT
from app.tools.call_context import ToolCallContext, current_call
from app.tools.registry import ToolRegistry, tool


def registry(calls_together: int = 1) -> ToolRegistry:
    """`whose_sync` and `whose_async` tell the tenant their call sees. With `calls_together`,
    each call waits until that many calls of its tool are in flight at once, so every one of
    them reads its tenant while the others are mid-call (the generous timeouts only turn a call
    that never gets company into a failure)."""
    in_threads = threading.Barrier(calls_together)
    on_loop = asyncio.Barrier(calls_together)

    @tool(timeout_s=120)
    def whose_sync() -> str:
        """The tenant a sync tool (run in the registry's thread pool) sees."""
        in_threads.wait(timeout=60)
        return current_call().tenant

    @tool(timeout_s=120)
    async def whose_async() -> str:
        """The tenant an async tool (run on the worker's loop) sees."""
        await asyncio.wait_for(on_loop.wait(), 60)
        return current_call().tenant

    tools = ToolRegistry()
    tools.register_function(whose_sync)
    tools.register_function(whose_async)
    return tools


async def test_sync_and_async_tools_see_their_calls_tenant() -> None:
    tools = registry(calls_together=8)
    for name in ("whose_sync", "whose_async"):
        calls = [tools.execute(name, {}, ToolCallContext(f"key-{i}")) for i in range(8)]
        results = await asyncio.gather(*calls)
        assert [r.content for r in results] == [f"key-{i}" for i in range(8)]


async def test_a_call_without_context_is_the_anonymous_tenants_and_nothing_leaks() -> None:
    tools = registry()
    await tools.execute("whose_async", {}, ToolCallContext("key-a"))
    assert (await tools.execute("whose_sync", {})).content == ANONYMOUS_TENANT
    assert current_call().tenant == ANONYMOUS_TENANT  # the caller's own context is untouched

