"""MCP servers as a tool source (app.tools.mcp_source), against the real example server."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import mcp_types
import psutil
import pytest

from app.config import McpServerConfig, ToolOverride
from app.tools.mcp_source import (
    McpSourceError,
    McpToolSource,
    output_from_call_result,
    spec_from_mcp_tool,
)
from app.tools.policy import may_pre_execute
from app.tools.registry import ToolRegistry, tool

EXAMPLE = McpServerConfig(
    name="example",
    command=[sys.executable, "-m", "app.tools.mcp_example_server"],
    timeout_s=10,
    startup_timeout_s=60,
)
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}


def example_servers() -> list[psutil.Process]:
    """The example MCP server processes this process started."""
    return [child for child in psutil.Process().children(recursive=True)
            if "app.tools.mcp_example_server" in " ".join(child.cmdline())]


def mcp_tool(**hints: bool) -> mcp_types.Tool:
    annotations = mcp_types.ToolAnnotations(**hints) if hints else None
    return mcp_types.Tool(name="t", description="d", input_schema=SCHEMA, annotations=annotations)


@pytest.mark.parametrize(
    ("hints", "idempotent", "speculate", "egress"),
    [
        ({}, False, "never", True),  # no hints: MCP defaults (not read-only, open world)
        ({"read_only_hint": True}, True, "always", True),
        ({"read_only_hint": True, "open_world_hint": False}, True, "always", False),
        ({"idempotent_hint": True}, True, "never", True),  # retry-safe, still writes
        ({"idempotent_hint": True, "destructive_hint": False}, True, "never", True),
        ({"read_only_hint": False, "idempotent_hint": False}, False, "never", True),
        ({"destructive_hint": True, "open_world_hint": False}, False, "never", False),
    ],
)
def test_hint_mapping(
    hints: dict[str, bool], idempotent: bool, speculate: str, egress: bool
) -> None:
    spec = spec_from_mcp_tool(mcp_tool(**hints), timeout_s=7)
    assert (spec.idempotent, spec.speculate, spec.egress) == (idempotent, speculate, egress)
    assert (spec.source, spec.timeout_s, spec.parameters) == ("mcp", 7, SCHEMA)


def test_call_results_become_tool_outputs() -> None:
    text = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="a"),
            mcp_types.TextContent(type="text", text="b"),
        ],
        structured_content={"result": "ignored"},
    )
    assert (output_from_call_result(text).content, output_from_call_result(text).is_error) == (
        "a\nb",
        False,
    )
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert output_from_call_result(structured).content == '{"n":1}'
    failed = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text="boom")], is_error=True
    )
    assert output_from_call_result(failed).is_error


@pytest.mark.timeout(120)
async def test_example_server_over_stdio() -> None:
    registry = ToolRegistry()
    source = McpToolSource([EXAMPLE])
    try:
        added = await source.start(registry)
        assert added == ["lookup_capital", "count_visit", "record_visit"]
        assert source.healthy and await source.check() == {}

        flags = {s.name: (s.idempotent, s.speculate, s.egress, s.source) for s in registry.specs()}
        assert flags == {
            "lookup_capital": (True, "always", False, "mcp"),
            "count_visit": (True, "never", False, "mcp"),
            "record_visit": (False, "never", True, "mcp"),
        }
        assert may_pre_execute(registry.get("lookup_capital"), True, False)
        assert not may_pre_execute(registry.get("record_visit"), True, True)
        listed = {entry["function"]["name"]: entry for entry in registry.openai_tools()}
        assert listed["lookup_capital"]["function"]["description"] == "Capital city of a country."
        assert listed["lookup_capital"]["source"] == "mcp"

        result = await registry.execute("lookup_capital", {"country": "France"})
        assert (result.content, result.is_error) == ("Paris", False)
        # A failure inside the server is an error result with the server's message.
        result = await registry.execute("lookup_capital", {"country": "Atlantis"})
        assert result.is_error and "no capital known for 'Atlantis'" in result.content
        # Arguments are validated against the server's schema before anything is sent.
        result = await registry.execute("lookup_capital", {"country": 3})
        assert result.is_error and result.content.startswith("invalid arguments")
        # The side-effecting tool really runs each time (one session, state kept).
        counts = [(await registry.execute("record_visit", {"place": "Oslo"})).content for _ in "ab"]
        assert counts == ["1", "2"]

        # Timeouts apply to MCP tools too (and overrides can name them). The server is stopped
        # (SIGSTOP) while the call is out: only the timeout can answer it, however fast the
        # server would have been; then it runs on.
        registry.apply_overrides({"lookup_capital": ToolOverride(timeout_s=0.2)})
        [server] = example_servers()
        server.suspend()
        try:
            # The bound only keeps a broken timeout from hanging the run.
            result = await asyncio.wait_for(
                registry.execute("lookup_capital", {"country": "Japan"}), 30)
        finally:
            server.resume()
        assert result.is_error and "timed out" in result.content
        # The session survives a timed-out call.
        assert (await registry.execute("count_visit", {"place": "Rome"})).content == "1"
    finally:
        await source.aclose()
    assert not source.healthy
    result = await registry.execute("count_visit", {"place": "Rome"})
    assert result.is_error and "unavailable" in result.content


@pytest.mark.timeout(120)
async def test_name_collisions_fail_and_close_the_servers() -> None:
    @tool
    def lookup_capital(country: str) -> str:
        return country

    registry = ToolRegistry()
    registry.register_function(lookup_capital)
    source = McpToolSource([EXAMPLE])
    with pytest.raises(McpSourceError, match="already registered"):
        await source.start(registry)
    assert not source.healthy


@pytest.mark.timeout(60)
async def test_servers_that_cannot_start_are_errors_within_bounds() -> None:
    missing = McpServerConfig(name="missing", command=["/nonexistent/mcp-server"])
    silent = McpServerConfig(
        name="silent",
        # Reads its stdin to the end and never answers: only the startup timeout ends the wait
        # (the process exits once the client closes the pipe or terminates it).
        command=[sys.executable, "-c", "import sys; sys.stdin.buffer.read()"],
        startup_timeout_s=0.5,
    )
    with pytest.raises(McpSourceError) as caught:
        # The bound only keeps a broken timeout from hanging the run; it is not a speed limit.
        await asyncio.wait_for(McpToolSource([missing, silent]).start(ToolRegistry()), 30)
    message = str(caught.value)
    assert "'missing' failed to start" in message
    assert "'silent' did not start within 0.5 s" in message
