"""A tiny MCP server over stdio, for tests and as a template.

Run: `python -m app.tools.mcp_example_server`.

Its tools cover the three ways MCP hints map onto ooo-spec's flags (see app/tools/mcp_source.py):
`lookup_capital` is read-only and closed-world (idempotent, speculable, no egress);
`count_visit` declares only `idempotentHint` (idempotent, still never speculated);
`record_visit` declares nothing (not idempotent: it only runs after the main model commits).
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

CAPITALS = {
    "france": "Paris",
    "germany": "Berlin",
    "italy": "Rome",
    "japan": "Tokyo",
    "kenya": "Nairobi",
    "brazil": "Brasília",
    "canada": "Ottawa",
    "australia": "Canberra",
}

server = MCPServer("ooo-spec-example")
# Per-process state, so tests can see how often a side-effecting tool really ran.
_visits: list[str] = []
_counted: set[str] = set()


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def lookup_capital(country: str) -> str:
    """Capital city of a country."""
    capital = CAPITALS.get(country.strip().lower())
    if capital is None:
        raise ToolError(f"no capital known for {country!r}")
    return capital


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=False))
def count_visit(place: str) -> int:
    """Mark a place as visited (marking it again changes nothing); returns how many are marked."""
    _counted.add(place)
    return len(_counted)


@server.tool()
def record_visit(place: str) -> int:
    """Record one more visit to a place; returns the number of visits recorded so far."""
    _visits.append(place)
    return len(_visits)


def main() -> None:
    # stdout is the protocol channel: anything else printed there would corrupt it.
    print("ooo-spec example MCP server on stdio", file=sys.stderr)
    server.run("stdio")


if __name__ == "__main__":
    main()
