"""The benchmark's own tool (load_tests/bench_tools.py), through the real tool registry."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from app.tools.registry import ToolRegistry
from load_tests import bench_tools
from load_tests.bench_tools import SLOW_TOOL_ENV, lookup_value


@pytest.fixture
def registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.load_modules(["app.tools.builtin", "load_tests.bench_tools"])
    return registry


async def test_slow_lookup_latency_is_configurable(
    registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tool's wait is recorded, not spent: the test checks the latency asked for.
    waits: list[float] = []

    async def recorded_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(bench_tools, "asyncio", SimpleNamespace(sleep=recorded_sleep))
    monkeypatch.setenv(SLOW_TOOL_ENV, "120")
    result = await registry.execute("slow_lookup", {"key": "user:42"})
    assert not result.is_error and waits == [pytest.approx(0.12)]
    assert json.loads(result.content) == {"key": "user:42", "value": lookup_value("user:42")}
    again = await registry.execute("slow_lookup", {"key": "user:42"})
    assert again.content == result.content  # deterministic
    monkeypatch.setenv(SLOW_TOOL_ENV, "soon")
    broken = await registry.execute("slow_lookup", {"key": "user:42"})
    assert broken.is_error and SLOW_TOOL_ENV in broken.content


def test_slow_lookup_is_speculable_and_not_a_builtin(registry: ToolRegistry) -> None:
    """Idempotent and `speculate: always`, so a right prediction starts it early; the product's
    own module does not register it."""
    spec = next(s for s in registry.specs() if s.name == "slow_lookup")
    assert (spec.idempotent, spec.speculate, spec.egress) == (True, "always", False)
    builtin_only = ToolRegistry()
    builtin_only.load_modules(["app.tools.builtin"])
    assert "slow_lookup" not in {s.name for s in builtin_only.specs()}
