"""`ToolWorker` deployment: runs server-known tools, from Python modules and MCP servers.

The router calls `execute(name, arguments, speculative=True)` for a validated prediction and
`execute(name, arguments)` for a committed call. A speculative call is checked against the
pre-execution policy here as well, so a router bug can never run a non-idempotent tool early.
Results are plain dicts (`ToolResult.model_dump()`); an execution never raises (an armed test
fault aside: `inject_fault` works only when the config enables fault injection).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray import serve

from app import telemetry
from app.config import load_config
from app.faults import TOOL_WORKER_FAULTS, FaultPlan
from app.tenancy import ANONYMOUS_TENANT
from app.tools.call_context import ToolCallContext
from app.tools.mcp_source import McpToolSource
from app.tools.policy import may_pre_execute
from app.tools.registry import ToolRegistry, ToolResult
from deployments.fault_handles import FaultHandles
from deployments.metrics import ServeMetrics


@serve.deployment(name="ToolWorker")
class ToolWorker(FaultHandles):
    # Async constructor (Ray Serve awaits it): MCP sessions are background tasks that must
    # live on the replica's event loop, the same loop that later serves `execute`.
    async def __init__(self, config: dict[str, Any]) -> None:  # type: ignore[misc]
        app_config = load_config(config)
        self.settings = app_config.tool_worker
        self.registry = ToolRegistry(
            max_threads=self.settings.threads
        )
        self.registry.load_modules(app_config.tools)
        self.mcp = McpToolSource(self.settings.mcp_servers)
        await self.mcp.start(self.registry)
        try:
            # After MCP registration, so overrides can name MCP tools too.
            self.registry.apply_overrides(self.settings.overrides)
        except Exception:
            await self.mcp.aclose()
            raise
        self.faults = FaultPlan(app_config.faults.enabled, TOOL_WORKER_FAULTS)
        # What reached this replica, by "name:speculative|committed": the privacy tests read it.
        self.received: Counter[str] = Counter()
        self.record_content = app_config.telemetry.record_content
        self.metrics = ServeMetrics()
        telemetry.setup_tracing("tool_worker")
        self._closed = False

    async def execute(
        self,
        name: str,
        arguments: dict[str, Any],
        speculative: bool = False,
        trace_context: dict[str, str] | None = None,
        tenant: str = ANONYMOUS_TENANT,
    ) -> dict[str, Any]:
        """`trace_context`: the caller's W3C carrier; this run is a `tool.execute` span in it.
        `tenant`: the caller's, the tool runs in its context (app/tools/call_context.py)."""
        with telemetry.span("tool.execute", telemetry.extract(trace_context)) as span:
            result = await self._execute(name, arguments, speculative, ToolCallContext(tenant))
            telemetry.set_attributes(span, telemetry.tool_attributes(
                name, speculative, result, arguments, self.record_content))
        telemetry.record_all(self.metrics, telemetry.tool_measurements(
            name, speculative, float(result.get("latency_ms") or 0.0)))
        return result

    async def _execute(
        self, name: str, arguments: dict[str, Any], speculative: bool, call: ToolCallContext
    ) -> dict[str, Any]:
        self.received[f"{name}:{'speculative' if speculative else 'committed'}"] += 1
        fault = self.faults.hit()
        if fault == "hang":
            await self.faults.hang()
        elif fault == "error":
            raise RuntimeError("injected fault: the tool worker failed")
        if speculative and not may_pre_execute(
            self.registry.get(name), self.settings.pre_execute, self.settings.allow_egress
        ):
            refused = ToolResult(
                name=name,
                content=f"pre-execution of {name!r} is not allowed by the tool policy",
                is_error=True,
                latency_ms=0.0,
            )
            return refused.model_dump()
        result = await self.registry.execute(name, arguments, call)
        return result.model_dump()

    def received_calls(self) -> dict[str, int]:
        return dict(self.received)

    def list_tools(self) -> list[dict[str, Any]]:
        """`GET /v1/tools` entries."""
        return self.registry.openai_tools()

    def tool_specs(self) -> list[dict[str, Any]]:
        """Full `ToolSpec`s (with `egress` and `timeout_s`), for the router's policy checks."""
        return [spec.model_dump() for spec in self.registry.specs()]

    async def check_health(self) -> None:
        problems = await self.mcp.check()
        if problems:
            detail = "; ".join(f"{name}: {why}" for name, why in problems.items())
            raise RuntimeError(f"MCP servers unhealthy: {detail}")

    async def __del__(self) -> None:
        # Ray Serve awaits this on graceful shutdown. The garbage collector calls it too, but
        # only creates a coroutine nobody runs; the flag makes a second awaited call a no-op.
        if getattr(self, "_closed", True):
            return
        self._closed = True
        await self.mcp.aclose()
        self.registry.close()
