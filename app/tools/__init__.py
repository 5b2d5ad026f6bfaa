"""Server-side tools: registry and decorator, built-in demo tools, MCP source, safety policy."""
