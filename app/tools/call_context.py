"""Who a tool call is for: the context the tool worker runs each call in.

The router passes the caller's tenant with every call (`ToolWorker.execute(..., tenant=...)`);
`ToolRegistry.execute` runs the implementation inside a `ToolCallContext` for it, on the event
loop and in the tool thread alike, so a tool that keeps state (the demo `append_note`) keeps it
per tenant by reading `current_call()`, with nothing added to its JSON arguments (a client
could set those).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from app.tenancy import ANONYMOUS_TENANT


@dataclass(frozen=True)
class ToolCallContext:
    tenant: str = ANONYMOUS_TENANT


_CURRENT: contextvars.ContextVar[ToolCallContext | None] = contextvars.ContextVar(
    "ooo_spec_tool_call", default=None
)


def current_call() -> ToolCallContext:
    """The call being run (the anonymous tenant's outside any call, e.g. a direct call)."""
    return _CURRENT.get() or ToolCallContext()


def context_for(call: ToolCallContext) -> contextvars.Context:
    """A copy of the current context in which `current_call()` is `call` (a task created
    with it, and the threads it hands work to with `copy_context()`, see it)."""
    context = contextvars.copy_context()
    context.run(_CURRENT.set, call)
    return context
