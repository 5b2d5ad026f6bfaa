"""Speculation privacy on the router side (app.api.pre_execution.PreExecution): a predicted call
to a tool that reaches outside services (`egress`) never leaves the router unless egress is
allowed, and nothing leaves with pre-execution switched off. The pool records every call that
reaches it, so "not dispatched" is observed, not inferred."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from app.api.pre_execution import PreExecution, ToolPolicy
from app.speculation.canonical import Invocation
from app.speculation.prediction import Prediction
from app.tools.registry import ToolResult, ToolSpec

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


class RecordingPool:
    def __init__(self, specs: list[ToolSpec]) -> None:
        self._specs = {s.name: s for s in specs}
        self.calls: list[tuple[str, bool]] = []

    async def specs(self) -> Mapping[str, ToolSpec]:
        return self._specs

    async def execute(self, name: str, arguments: dict[str, Any], speculative: bool,
                      tenant: str) -> ToolResult:
        self.calls.append((name, speculative))
        return ToolResult(name=name, content="ok", latency_ms=0.0)


def spec(name: str, egress: bool) -> ToolSpec:
    return ToolSpec(name=name, parameters=SCHEMA, idempotent=True, speculate="always",
                    timeout_s=5, source="python", egress=egress)


async def dispatched(policy: ToolPolicy, calls: list[str]) -> list[tuple[str, bool]]:
    pool = RecordingPool([spec("web_search", True), spec("local_lookup", False)])
    pre = PreExecution(pool, policy, {"web_search": SCHEMA, "local_lookup": SCHEMA})
    prediction = Prediction(candidates=[[{"name": n, "arguments": {"q": "x"}} for n in calls]])
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    ready.set_result(prediction.model_dump())
    pre.watch(ready)
    assert pre._watcher is not None
    await asyncio.wait({pre._watcher})  # the prediction handled: its allowed calls dispatched
    await pre.settle([Invocation(name=n, arguments={"q": "x"}) for n in calls], wait=True)
    return pool.calls


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (ToolPolicy(pre_execute=True, allow_egress=False), [("local_lookup", True)]),
        (ToolPolicy(pre_execute=True, allow_egress=True),
         [("web_search", True), ("local_lookup", True)]),
        (ToolPolicy(pre_execute=False, allow_egress=True), []),
        (ToolPolicy(pre_execute=False, allow_egress=False), []),
    ],
    ids=["egress-blocked", "egress-allowed", "switched-off", "switched-off-strict"],
)
async def test_what_leaves_the_router_before_the_commit(
    policy: ToolPolicy, expected: list[tuple[str, bool]]
) -> None:
    calls = await dispatched(policy, ["web_search", "local_lookup"])
    assert sorted(calls) == sorted(expected)
