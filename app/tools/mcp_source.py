"""MCP servers as a second tool source: stdio subprocesses whose tools join the registry.

Each configured server gets one long-lived session, held open by a background task for the life
of the tool worker (MCP's client is a context manager, and anyio wants it entered and left in the
same task). Calls from any task go through that session; the registry's timeout bounds them.

How MCP tool annotations become ooo-spec flags (MCP defaults: readOnlyHint false,
idempotentHint false, destructiveHint true, openWorldHint true):

- idempotent = readOnlyHint or idempotentHint. A tool with neither is not idempotent.
- speculate = "always" only for read-only tools. An idempotent tool that writes may be retried
  safely, but running it because of a prediction the main model never commits would still change
  the world; an operator who knows better sets `tool_worker.overrides`.
- egress = openWorldHint (true when absent, as MCP says), so an unannotated server's tools are
  not pre-executed unless `tool_worker.allow_egress`.

A server that dies mid-run marks its connection unhealthy (the tool worker's health check then
fails and Serve restarts the replica); its tools return error results meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import mcp_types
import pydantic_core
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import CONNECTION_CLOSED, CallToolResult
from pydantic import ValidationError

from app.config import McpServerConfig
from app.tools.registry import ToolDefinitionError, ToolOutput, ToolRegistry, ToolRunner, ToolSpec

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="ooo-spec", version="0.1.0")
# Bounds the tools/list walk: a server whose cursor never ends cannot hang startup.
_MAX_LIST_PAGES = 100
# Closing stdin, then SIGTERM, then SIGKILL takes the SDK up to ~6 s in the worst case.
_CLOSE_TIMEOUT_S = 10.0


class McpSourceError(RuntimeError):
    """An MCP server could not be started, listed or registered."""


def spec_from_mcp_tool(tool: mcp_types.Tool, *, timeout_s: float) -> ToolSpec:
    """The registry's view of one MCP tool (see the module docstring for the hint mapping)."""
    hints = tool.annotations or mcp_types.ToolAnnotations()
    read_only = hints.read_only_hint is True
    idempotent = read_only or hints.idempotent_hint is True
    return ToolSpec(
        name=tool.name,
        description=tool.description or tool.title or "",
        parameters=dict(tool.input_schema),
        idempotent=idempotent,
        speculate="always" if read_only else "never",
        timeout_s=timeout_s,
        source="mcp",
        egress=hints.open_world_hint is not False,
    )


def output_from_call_result(result: CallToolResult) -> ToolOutput:
    """Text blocks joined as they are; without text, the structured result (or blocks) as JSON."""
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if texts:
        content = "\n".join(texts)
    elif result.structured_content is not None:
        content = pydantic_core.to_json(result.structured_content).decode()
    else:
        blocks = [block.model_dump(mode="json", by_alias=True) for block in result.content]
        content = pydantic_core.to_json(blocks).decode()
    return ToolOutput(content, bool(result.is_error))


# Config files cannot know where the serving venv lives, and a Ray worker's PATH need not
# include it: a bare "python" means the interpreter running this process (with its packages).
_SELF_PYTHON = frozenset({"python", "python3"})


def server_program(program: str) -> str:
    """The executable to start: `sys.executable` for a bare "python"/"python3", else as given."""
    return sys.executable if program in _SELF_PYTHON else program


class McpServerConnection:
    """One MCP server subprocess and its session."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._client: Client | None = None
        self._stop = asyncio.Event()
        self._listed: asyncio.Future[list[mcp_types.Tool]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._broken: str | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def healthy(self) -> bool:
        return (
            self._client is not None
            and self._broken is None
            and self._task is not None
            and not self._task.done()
        )

    @property
    def problem(self) -> str | None:
        """Why the connection is unhealthy, or None."""
        if self._broken is not None:
            return self._broken
        if self._task is None:
            return "not started"
        if self._task.done() or self._client is None:
            return "session ended"
        return None

    async def start(self) -> list[mcp_types.Tool]:
        """Spawn the server, open the session and list its tools, within startup_timeout_s."""
        if self._task is not None:
            raise McpSourceError(f"MCP server {self.name!r} was already started")
        self._listed = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(self._listed), name=f"mcp:{self.name}")
        try:
            return await asyncio.wait_for(
                asyncio.shield(self._listed), self.config.startup_timeout_s
            )
        except TimeoutError:
            await self.aclose()
            raise McpSourceError(
                f"MCP server {self.name!r} did not start within "
                f"{self.config.startup_timeout_s:g} s (command: {self.config.command})"
            ) from None
        except McpSourceError:
            await self.aclose()
            raise

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> ToolOutput:
        client = self._client
        if client is None or self._broken is not None:
            why = self.problem or "not connected"
            return ToolOutput(f"MCP server {self.name!r} is unavailable: {why}", True)
        try:
            result = await client.call_tool(tool_name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._broken = "connection closed (the server process exited?)"
                logger.error("MCP server %r: connection closed", self.name)
            return ToolOutput(f"MCP server {self.name!r}: {exc.message}", True)
        return output_from_call_result(result)

    async def probe(self, timeout_s: float) -> bool:
        """Round-trip to the server (a tools/list; MCP 2026-07-28 removed ping); a failure
        marks the connection broken."""
        client = self._client
        if client is None or self._broken is not None:
            return False
        try:
            await asyncio.wait_for(client.list_tools(), timeout_s)
        except TimeoutError:
            self._broken = f"no answer within {timeout_s:g} s"
        except MCPError as exc:
            self._broken = f"probe failed: {exc.message}"
        return self._broken is None

    def runner(self, tool_name: str) -> ToolRunner:
        async def run(arguments: dict[str, Any]) -> ToolOutput:
            return await self.call(tool_name, arguments)

        return run

    async def aclose(self) -> None:
        """End the session and the subprocess; safe to call more than once."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self._client is not None:
            # A live session leaves through its context manager: stdin closed, process reaped.
            done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT_S)
            if done:
                return
        # Still starting (stuck in the handshake) or not leaving: cancellation is the only way
        # out; the SDK's shutdown still terminates the process under it.
        task.cancel()
        await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT_S)

    async def _hold(self, listed: asyncio.Future[list[mcp_types.Tool]]) -> None:
        params = StdioServerParameters(
            command=server_program(self.config.command[0]),
            args=list(self.config.command[1:]),
            env=dict(self.config.env) or None,
        )
        try:
            # cache=None: a tool call must reach the server every time, never a client cache.
            async with Client(params, cache=None, client_info=CLIENT_INFO) as client:
                tools = await _list_all_tools(client)
                self._client = client
                if not listed.done():
                    listed.set_result(tools)
                await self._stop.wait()
        except Exception as exc:  # noqa: BLE001 - reported through `listed` or health
            message = _exception_text(exc)
            if not listed.done():
                listed.set_exception(
                    McpSourceError(f"MCP server {self.name!r} failed to start: {message}")
                )
            else:
                self._broken = f"session failed: {message}"
                logger.error("MCP server %r: session failed: %s", self.name, message)
        finally:
            self._client = None


class McpToolSource:
    """All configured MCP servers: started together, registered into one registry."""

    def __init__(self, configs: Sequence[McpServerConfig]) -> None:
        self.connections = [McpServerConnection(config) for config in configs]

    async def start(self, registry: ToolRegistry) -> list[str]:
        """Start every server, then register their tools; returns the names registered.

        Any server failing to start is an error (after closing the others), so a broken
        configuration is seen at deployment time rather than as missing tools later.
        """
        results = await asyncio.gather(
            *(connection.start() for connection in self.connections), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.aclose()
            raise McpSourceError("; ".join(_exception_text(f) for f in failures))
        added: list[str] = []
        for connection, tools in zip(self.connections, results, strict=True):
            assert not isinstance(tools, BaseException)
            for mcp_tool in tools:
                try:
                    spec = spec_from_mcp_tool(mcp_tool, timeout_s=connection.config.timeout_s)
                except ValidationError as exc:
                    # One tool with an unusable schema should not take the server's others down.
                    logger.warning(
                        "MCP server %r: skipping tool %r: %s", connection.name, mcp_tool.name, exc
                    )
                    continue
                try:
                    registry.register(spec, connection.runner(mcp_tool.name))
                except ToolDefinitionError as exc:
                    await self.aclose()
                    raise McpSourceError(f"MCP server {connection.name!r}: {exc}") from exc
                added.append(spec.name)
        return added

    @property
    def healthy(self) -> bool:
        return all(connection.healthy for connection in self.connections)

    async def check(self, timeout_s: float = 5.0) -> dict[str, str]:
        """Probe every server; returns `problems()` afterwards (empty when all are fine)."""
        await asyncio.gather(*(c.probe(timeout_s) for c in self.connections))
        return self.problems()

    def problems(self) -> dict[str, str]:
        """Server name -> why it is unhealthy, for the ones that are."""
        return {c.name: problem for c in self.connections if (problem := c.problem) is not None}

    async def aclose(self) -> None:
        await asyncio.gather(*(connection.aclose() for connection in self.connections))


async def _list_all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpSourceError(f"tools/list did not end within {_MAX_LIST_PAGES} pages")


def _exception_text(exc: BaseException) -> str:
    # anyio task groups wrap the real cause in ExceptionGroups; show the innermost causes.
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_exception_text(inner) for inner in exc.exceptions)
    if isinstance(exc, McpSourceError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
