"""No schema work on an event loop: the router's outcome classification and pre-execution keys
(canonical equality validates against the schemas) and the tool worker's argument check run in
worker threads. Each spy records the thread it ran on; the loop's thread must not be one."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import app.api.chat_service as chat_service
import app.tools.policy as policy
import app.tools.registry as registry
from app.api.chat_service import ChatService
from tests.unit.test_agent_loop import FakePool, Script, complete, final, lookup, request


def spy_on(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[threading.Thread]:
    threads: list[threading.Thread] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return threads


async def test_the_router_classifies_and_keys_calls_off_its_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome_threads = spy_on(monkeypatch, chat_service, "classify_outcome")
    key_threads = spy_on(monkeypatch, policy, "canonical_invocation")
    pool = FakePool(lookup_s=0.01)
    # Equal only once the schema's default is filled in: the keys did validate.
    script = Script([final([lookup("a", mode="fast")]), final([], "done")],
                    predictions=[[lookup("a")]], commit_after=pool.speculated)
    out = await complete(ChatService("m", True, pool), request(execute_tools=True), script)
    [result] = out["ooo_spec"]["tool_results"]
    assert result["speculative"] is True  # the pre-executed run answered the committed call
    assert pool.calls == [("lookup", {"key": "a"}, True)]
    loop_thread = threading.current_thread()
    assert outcome_threads and loop_thread not in outcome_threads
    # Keys of the predicted call (start) and of the committed one (settle).
    assert len(key_threads) >= 2 and loop_thread not in key_threads


async def test_the_tool_worker_validates_arguments_off_its_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = spy_on(monkeypatch, registry, "validate_arguments")
    tools = FakePool(lookup_s=0.0).registry
    good = await tools.execute("lookup", {"key": "a"})
    bad = await tools.execute("lookup", {"key": 3})
    assert not good.is_error and bad.is_error and "invalid arguments" in bad.content
    assert len(threads) == 2 and threading.current_thread() not in threads
