"""Speculative pre-execution: which calls may run before the main model commits, and which
pre-executed results may answer a committed call. Pure logic, no I/O: the safety argument
lives here and is tested here.

The rules (docs/tools.md, "Pre-execution"):
- A call runs before the commit only if its tool is server-known, idempotent, marked
  `speculate: always`, pre-execution is switched on, and it does not reach outside services
  (`egress`) unless that is allowed. Everything else runs only after the main model commits it.
- A pre-executed result answers a committed call only when the two are canonically equal
  (same name; arguments equal after filling the tool's schema defaults, key order ignored,
  1 == 1.0). Parallel calls match as a multiset: one pre-execution answers one committed call.
- An error result is never reused: a speculative run can fail for reasons of its own (a
  timeout under load, a cancelled run), and rerunning an idempotent tool is always allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.speculation.canonical import Invocation, canonical_invocation
from app.tools.registry import ToolResult, ToolSpec


def may_pre_execute(tool: ToolSpec | None, global_enabled: bool, allow_egress: bool) -> bool:
    """Whether a predicted call of `tool` (None: not server-known) may run before the commit."""
    return (
        tool is not None
        and global_enabled
        and tool.idempotent
        and tool.speculate == "always"
        and (allow_egress or not tool.egress)
    )


def _reusable(tool: ToolSpec | None) -> bool:
    # Checked again when results are handed out, so a result that should never have existed
    # (a bug upstream) still cannot stand in for a non-idempotent call.
    return tool is not None and tool.idempotent and tool.speculate == "always"


def invocation_key(invocation: Invocation, tools: Mapping[str, ToolSpec]) -> str:
    """Canonical key of a call under its tool's schema (no schema for unknown tools)."""
    tool = tools.get(invocation.name)
    return canonical_invocation(invocation, tool.parameters if tool is not None else None)


@dataclass
class _Entry:
    invocation: Invocation
    result: ToolResult | None = None
    taken: bool = False


class PreExecutionLedger:
    """Pre-executions of one request, keyed by canonical invocation.

    The router asks `start` before running a predicted call (True at most once per canonical
    call, and only when `may_pre_execute` allows it), `record`s the result, and asks `take`
    for each committed call. `is_pending` tells it to await a run still in flight rather than
    start the same call again. Each method takes the call's `key` when the caller has it:
    computing one validates against the tool's schema, which a caller on an event loop does in
    a worker thread.
    """

    def __init__(
        self,
        tools: Mapping[str, ToolSpec],
        *,
        global_enabled: bool = True,
        allow_egress: bool = False,
    ) -> None:
        self._tools = dict(tools)
        self._enabled = global_enabled
        self._allow_egress = allow_egress
        self._entries: dict[str, _Entry] = {}

    def key(self, invocation: Invocation) -> str:
        return invocation_key(invocation, self._tools)

    def _key(self, invocation: Invocation, key: str | None) -> str:
        return key if key is not None else self.key(invocation)

    def start(self, invocation: Invocation, key: str | None = None) -> bool:
        """Claim the right to pre-execute `invocation`: False if not allowed or already claimed."""
        tool = self._tools.get(invocation.name)
        if not may_pre_execute(tool, self._enabled, self._allow_egress):
            return False
        key = self._key(invocation, key)
        if key in self._entries:
            return False
        self._entries[key] = _Entry(invocation)
        return True

    def record(self, invocation: Invocation, result: ToolResult, key: str | None = None
               ) -> None:
        entry = self._entries.get(self._key(invocation, key))
        if entry is None:
            raise KeyError(f"no pre-execution of {invocation.name!r} was started")
        entry.result = result

    def is_pending(self, invocation: Invocation, key: str | None = None) -> bool:
        """Started, result not recorded yet: await it instead of running the call again."""
        entry = self._entries.get(self._key(invocation, key))
        return entry is not None and entry.result is None and not entry.taken

    def take(self, committed: Invocation, key: str | None = None) -> ToolResult | None:
        """The recorded result for a canonically equal call, once; None otherwise."""
        if not _reusable(self._tools.get(committed.name)):
            return None
        entry = self._entries.get(self._key(committed, key))
        if entry is None or entry.taken or entry.result is None or entry.result.is_error:
            return None
        entry.taken = True
        return entry.result
