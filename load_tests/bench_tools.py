"""Tools of the benchmark, served like the product's tools but not among them.

`slow_lookup` makes pre-execution's saving visible: a lookup with a fixed latency
(`OOO_SPEC_SLOW_TOOL_MS`, default 500 ms) and a deterministic answer, idempotent and speculable,
so a right prediction starts it while the main model still decodes. configs/bench.yaml lists
this module under `tools:` beside `app.tools.builtin`, and so does the tests' app
(tests/conftest.py); the replicas import it from the repository root, which
`deployments/local.py` puts on their PYTHONPATH. The agent scenario set
(app/datasets/agent_scenarios.py) quotes what it returns.
"""

from __future__ import annotations

import asyncio
import math
import os
from typing import Annotated, Any

from pydantic import Field

from app.datasets.agent_scenarios import lookup_value
from app.tools.registry import tool

SLOW_TOOL_ENV = "OOO_SPEC_SLOW_TOOL_MS"
DEFAULT_SLOW_TOOL_MS = 500.0


def slow_tool_delay_s() -> float:
    raw = os.environ.get(SLOW_TOOL_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SLOW_TOOL_MS / 1000.0
    try:
        ms = float(raw)
    except ValueError:
        raise ValueError(f"{SLOW_TOOL_ENV}={raw!r} is not a number of milliseconds") from None
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"{SLOW_TOOL_ENV}={raw!r} must be a non-negative number")
    return ms / 1000.0


@tool(idempotent=True, timeout_s=30.0)
async def slow_lookup(
    key: Annotated[str, Field(min_length=1, max_length=200, description="Record key.")],
) -> dict[str, Any]:
    """Look up a record in a slow remote-like store (latency set by OOO_SPEC_SLOW_TOOL_MS)."""
    await asyncio.sleep(slow_tool_delay_s())
    return {"key": key, "value": lookup_value(key)}
