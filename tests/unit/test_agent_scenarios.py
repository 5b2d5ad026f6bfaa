"""The agent scenario set (app/datasets/agent_scenarios.py) against the real demo tool registry:
every scenario becomes a request the server accepts, offers the server's own schemas (narrowed
where asked), and its history quotes what the tools really return."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.datasets.agent_scenarios import (
    KEYS,
    SCENARIOS,
    AgentCase,
    MissingToolError,
    load_agent_cases,
    request_tool,
)
from app.openai_models import ChatCompletionRequest
from app.speculation.validation import validate_arguments
from app.tools.registry import ToolRegistry, ToolSpec
from load_tests.bench_tools import SLOW_TOOL_ENV, lookup_value

# What the example MCP server lists (its tools are not importable Python functions).
CAPITAL = ToolSpec(
    name="lookup_capital", description="Capital city of a country.",
    parameters={"type": "object", "properties": {"country": {"type": "string"}},
                "required": ["country"]},
    idempotent=True, speculate="always", timeout_s=30, source="mcp",
)


@pytest.fixture(scope="module")
def registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.load_modules(["app.tools.builtin", "load_tests.bench_tools"])
    return reg


@pytest.fixture(scope="module")
def listing(registry: ToolRegistry) -> list[dict[str, Any]]:
    return [*registry.openai_tools(), CAPITAL.openai_tool()]


def test_every_scenario_is_a_valid_request(listing: list[dict[str, Any]]) -> None:
    cases = load_agent_cases(listing)
    assert len(cases) == len(SCENARIOS) >= 10
    assert len({c.id for c in cases}) == len(cases)
    for case in cases:
        request = ChatCompletionRequest.model_validate({
            "messages": case.messages, "tools": case.tools, "tool_choice": case.tool_choice,
            "max_tokens": case.max_tokens,
            "ooo_spec": {"execute_tools": True, "max_steps": case.max_steps,
                         "server_tools": True},
        })
        assert request.messages[-1].role == "user"
        # Only deterministic, idempotent tools: every mode must get the same results.
        offered = {t["function"]["name"] for t in case.tools}
        assert offered <= {"slow_lookup", "calculator", "convert_units", "search_docs",
                           "lookup_capital"}
    # Multi-turn: most scenarios carry earlier tool rounds.
    with_history = [c for c in cases if any(m["role"] == "tool" for m in c.messages)]
    assert len(with_history) >= len(cases) // 2


def test_schemas_come_from_the_server_and_narrowing_only_adds_an_enum(
    listing: list[dict[str, Any]],
) -> None:
    by_name = {e["function"]["name"]: e for e in listing}
    case = next(c for c in load_agent_cases(listing) if c.id == "agent_lookup_followup_tokyo")
    lookup = next(t for t in case.tools if t["function"]["name"] == "slow_lookup")
    server = by_name["slow_lookup"]["function"]["parameters"]
    narrowed = lookup["function"]["parameters"]
    assert narrowed["properties"]["key"]["enum"] == KEYS
    narrowed_without_enum = json.loads(json.dumps(narrowed))
    del narrowed_without_enum["properties"]["key"]["enum"]
    assert narrowed_without_enum == server
    assert "enum" not in server["properties"]["key"]  # the listing itself is untouched
    # Every narrowed value is one the server's schema accepts, and the asked key is offered.
    for key in KEYS:
        assert validate_arguments({"key": key}, server) == []
    assert "'tokyo'" in case.messages[-1]["content"]


def test_named_choice_and_rounds(listing: list[dict[str, Any]]) -> None:
    cases = {c.id: c for c in load_agent_cases(listing)}
    assert cases["agent_lookup_named"].tool_choice == {
        "type": "function", "function": {"name": "slow_lookup"}}
    assert cases["agent_lookup_two_rounds"].max_steps == 2
    assert cases["agent_lookup_followup_tokyo"].tool_choice == "required"
    assert load_agent_cases(listing, limit=3) == list(cases.values())[:3]


async def test_history_quotes_what_slow_lookup_returns(
    registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLOW_TOOL_ENV, "0")
    for key in ("paris", "tokyo"):
        result = await registry.execute("slow_lookup", {"key": key})
        assert not result.is_error
        assert json.loads(result.content) == {"key": key, "value": lookup_value(key)}


def test_missing_server_tool_is_a_clear_error(listing: list[dict[str, Any]]) -> None:
    without_mcp = [e for e in listing if e["function"]["name"] != "lookup_capital"]
    with pytest.raises(MissingToolError, match="lookup_capital"):
        load_agent_cases(without_mcp)
    with pytest.raises(MissingToolError, match="no parameter 'city'"):
        request_tool(listing[0], {"city": ["x"]})


def test_agent_case_is_frozen() -> None:
    case = AgentCase(id="a", messages=[{"role": "user", "content": "x"}], tools=[])
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type varies
        case.id = "b"  # type: ignore[misc]
