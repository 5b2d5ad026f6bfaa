"""End to end: server-known tools through the real app (router, main, sidecar, ToolWorker with
the example MCP server from configs/local.yaml) and the real `openai` client.

These assert structure and the safety rules, not the 135M model's judgement."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import httpx
import pytest

from app.tenancy import ANONYMOUS_TENANT
from app.tools.builtin import notes_path

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server_tools(app_url: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{app_url}/v1/tools", timeout=30)
    assert response.status_code == 200
    return {t["function"]["name"]: t for t in response.json()["data"]}


def as_request_tool(entry: dict[str, Any]) -> dict[str, Any]:
    """What a client copies from `GET /v1/tools` into `tools`."""
    return {"type": "function", "function": copy.deepcopy(entry["function"])}


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def test_v1_tools_lists_python_and_mcp_tools(server_tools: dict[str, dict[str, Any]]) -> None:
    for entry in server_tools.values():
        assert set(entry) == {"type", "function", "idempotent", "speculate", "source"}
        assert entry["type"] == "function"
        assert set(entry["function"]) == {"name", "description", "parameters"}
    flags = {n: (e["idempotent"], e["speculate"], e["source"]) for n, e in server_tools.items()}
    assert flags["slow_lookup"] == (True, "always", "python")
    assert flags["append_note"] == (False, "never", "python")
    assert flags["lookup_capital"] == (True, "always", "mcp")
    assert flags["record_visit"] == (False, "never", "mcp")


def test_correct_prediction_pre_executes_slow_lookup(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    """The request narrows `key` to an enum: the 135M sidecar's free-text string slots are
    mostly wrong ('{key}'), an enum slot it gets right, so the candidate is correct and early
    (the tool is still server-known by name, and the worker validates against its own schema)."""
    tool = as_request_tool(server_tools["slow_lookup"])
    tool["function"]["parameters"]["properties"]["key"]["enum"] = ["paris", "london", "tokyo"]
    hits = []
    for _ in range(4):
        response = openai_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Look up the record 'paris'."}],
            tools=[tool],
            tool_choice=named("slow_lookup"),
            temperature=0,
            max_tokens=48,
            # The same question four times: without this, the first call would come back as a
            # history (or suffix) draft at time zero and the main model would finish before the
            # sidecar.
            extra_body={"ooo_spec": {"enabled": True, "execute_tools": True,
                                     "server_tools": True, "max_steps": 1,
                                     "history": False, "suffix": False}},
        )
        report = response.model_extra["ooo_spec"]
        results = report["tool_results"]
        assert results and results[0]["name"] == "slow_lookup"
        assert results[0]["tool_call_id"].startswith("call_")
        assert results[0]["latency_ms"] >= 400  # the tool sleeps 500 ms
        assert report["timings_ms"]["tools"] >= 0
        # The loop's last turn answers in text: no tool calls left for the client.
        assert response.choices[0].message.tool_calls is None
        if results[0]["speculative"] and results[0]["saved_ms"] > 0:
            hits.append(results[0])
            break
    assert hits, "no speculative hit in 4 tries"
    hit = hits[0]
    value = hashlib.sha256(b"paris").hexdigest()[:16]
    assert json.loads(hit["content"]) == {"key": "paris", "value": value}
    assert hit["saved_ms"] <= hit["latency_ms"] + 1e-6


def count_notes() -> int:
    # The shared app has no API keys: every call is the anonymous tenant's (one notes file each).
    path = notes_path(ANONYMOUS_TENANT)
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def test_append_note_is_never_pre_executed(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    tools = [as_request_tool(server_tools["append_note"])]
    # The server runs a tool by its name; the request's schema may be tighter than the server's.
    # A short note keeps the forced call inside max_tokens (under the schema, greedy decoding
    # of this small model otherwise writes the note on until the budget runs out).
    tools[0]["function"]["parameters"]["properties"]["text"]["maxLength"] = 24
    messages = [{"role": "user", "content": "Save a note: buy milk."}]
    before = count_notes()
    # Speculation on, tools not executed: the sidecar's prediction must not write a note.
    response = openai_client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, tool_choice="required", temperature=0,
        max_tokens=64, extra_body={"ooo_spec": {"enabled": True, "execute_tools": False,
                                 "server_tools": True}},
    )
    assert response.choices[0].message.tool_calls
    assert response.model_extra["ooo_spec"]["tool_results"] == []
    # Executed by the server: exactly one line per committed call, none of them speculative.
    # A pre-execution of the first request would have been sent before that request's answer,
    # so it lands while this second request runs: the count below includes it (no sleep).
    response = openai_client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, tool_choice="required", temperature=0,
        max_tokens=64,
        extra_body={"ooo_spec": {"enabled": True, "execute_tools": True,
                                 "server_tools": True, "max_steps": 1}},
    )
    results = response.model_extra["ooo_spec"]["tool_results"]
    assert results and all(r["name"] == "append_note" for r in results)
    assert all(r["speculative"] is False and r["saved_ms"] == 0 for r in results)
    assert count_notes() == before + len(results)


def test_execute_tools_two_rounds_then_final_answer(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 * 7? Then add 5 to the result."}],
        tools=[as_request_tool(server_tools["calculator"])],
        tool_choice="required",
        temperature=0,
        # Every turn counts against this one budget (two calls and the answer fit).
        max_tokens=128,
        extra_body={"ooo_spec": {"enabled": True, "execute_tools": True,
                                 "server_tools": True, "max_steps": 2}},
    )
    assert response.usage.completion_tokens <= 128
    choice = response.choices[0]
    # `max_steps` tool rounds under `required`, then one turn that must answer in text.
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    report = response.model_extra["ooo_spec"]
    results = report["tool_results"]
    assert [r["name"] for r in results] == ["calculator", "calculator"]
    assert len({r["tool_call_id"] for r in results}) == 2
    assert all(r["content"] for r in results)
    # Counts are summed over the three turns, and usage agrees with them.
    assert report["main"]["completion_tokens"] == response.usage.completion_tokens
    assert report["main"]["steps"] >= 3
    assert report["timings_ms"]["total"] >= report["timings_ms"]["main"] > 0


def test_the_loops_turns_stay_within_max_tokens(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    """Issue 39: `max_tokens: 48` with the loop allowed 16 rounds generated 86 tokens over 3
    turns. The turns now share the one budget; once it is spent the call comes back."""
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 * 7? Then add 5 to the result."}],
        tools=[as_request_tool(server_tools["calculator"])],
        tool_choice="required",
        temperature=0,
        max_tokens=48,
        extra_body={"ooo_spec": {"enabled": True, "execute_tools": True,
                                 "server_tools": True, "max_steps": 16}},
    )
    assert 0 < response.usage.completion_tokens <= 48
    assert response.model_extra["ooo_spec"]["main"]["completion_tokens"] <= 48


def test_unknown_tool_goes_back_to_the_client(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]},
        },
    }
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[weather, as_request_tool(server_tools["calculator"])],
        tool_choice=named("get_weather"),
        temperature=0,
        max_tokens=48,
        extra_body={"ooo_spec": {"execute_tools": True, "server_tools": True}},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert response.model_extra["ooo_spec"]["tool_results"] == []


def test_mcp_tool_runs_in_the_loop(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        tools=[as_request_tool(server_tools["lookup_capital"])],
        tool_choice=named("lookup_capital"),
        temperature=0,
        max_tokens=48,
        extra_body={"ooo_spec": {"execute_tools": True, "server_tools": True, "max_steps": 1}},
    )
    [result] = response.model_extra["ooo_spec"]["tool_results"]
    assert result["name"] == "lookup_capital"
    assert result["content"] == "Paris"  # greedy: the model writes 'france'; the server answers


def test_streaming_with_execute_tools(  # type: ignore[no-untyped-def]
    openai_client, server_tools: dict[str, dict[str, Any]]
) -> None:
    stream = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 * 7?"}],
        tools=[as_request_tool(server_tools["calculator"])],
        tool_choice="required",
        temperature=0,
        max_tokens=48,
        stream=True,
        extra_body={"ooo_spec": {"execute_tools": True, "server_tools": True, "max_steps": 1}},
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    report = chunks[-1].model_extra["ooo_spec"]
    assert [r["name"] for r in report["tool_results"]] == ["calculator"]
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
