"""A small multi-turn agent scenario set on the server's demo and bench tools: the bench's
`agent` dataset, and a source of the sidecar's distillation (`app/distill/collect.py`).

Each scenario is a conversation that already went on for a turn or two (earlier calls and their
results are in the history) and ends with a user request the server answers with
`ooo_spec.execute_tools: true`: the main model commits a call, the server runs it on the tool
pool, feeds the result back, and the last turn answers in text. Only idempotent tools with
deterministic results are used (`slow_lookup` of load_tests/bench_tools.py, the built-in
`calculator`, `convert_units`, `search_docs`, and the example MCP server's `lookup_capital`), so
every mode can be compared output for output. The server must list the bench's tools
(configs/bench.yaml does).

Tool definitions are not copied here: they come from the server's `GET /v1/tools` at run time
(what a client does), so a scenario always offers the schema the server runs. A scenario may
narrow a string parameter to an `enum` of the values its conversation is about: the embedded
135M sidecar fills free-text string slots badly but picks from an enum well, and a narrower
schema is still one the server's tool accepts.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SOURCE = "agent"
CATEGORY = "agent"
SYSTEM = "You are a helpful assistant. Use the tools to answer; keep answers short."
KEYS = ["paris", "london", "tokyo", "berlin", "nairobi"]
COUNTRIES = ["France", "Japan", "Kenya", "Canada", "Brazil"]


def lookup_value(key: str) -> str:
    """What the bench tool `slow_lookup` (load_tests/bench_tools.py) answers as `value` for
    `key`: the scenarios' earlier results are its answers."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


class AgentCase(BaseModel):
    """One scenario as a request: messages, the tools it offers and how the loop runs."""

    model_config = ConfigDict(frozen=True)

    id: str
    category: str = CATEGORY
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any] = "required"
    max_steps: int = Field(1, ge=1, le=4)
    # Per turn; small because the last turn is free text and the point is the tool call.
    max_tokens: int = Field(48, ge=16)


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    history: list[dict[str, Any]]  # everything before the final user message
    ask: str  # the final user message
    tools: list[str]  # server tool names offered, in this order
    narrow: dict[str, dict[str, list[Any]]] = {}  # tool -> parameter -> enum
    tool_choice: str = "required"  # or a tool name (named choice)
    max_steps: int = 1


def exchange(
    call_id: str, question: str, tool: str, arguments: Mapping[str, Any], result: Any, answer: str
) -> list[dict[str, Any]]:
    """One earlier round of the conversation: question, call, tool result, answer."""
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": tool, "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": call_id,
         "content": result if isinstance(result, str) else json.dumps(result)},
        {"role": "assistant", "content": answer},
    ]


def _lookup_round(call_id: str, key: str) -> list[dict[str, Any]]:
    value = lookup_value(key)
    return exchange(call_id, f"Look up the record '{key}'.", "slow_lookup", {"key": key},
                    {"key": key, "value": value}, f"The record '{key}' has value {value}.")


def _capital_round(call_id: str, country: str, capital: str) -> list[dict[str, Any]]:
    return exchange(call_id, f"What is the capital of {country}?", "lookup_capital",
                    {"country": country}, capital, f"The capital of {country} is {capital}.")


def _scenarios() -> list[Scenario]:
    lookup_only = {"slow_lookup": {"key": KEYS}}
    capitals = {"lookup_capital": {"country": COUNTRIES}}
    return [
        Scenario(id="lookup_followup_tokyo", history=_lookup_round("call_a1", "paris"),
                 ask="And the record 'tokyo'?", tools=["slow_lookup", "calculator"],
                 narrow=lookup_only),
        Scenario(id="lookup_followup_london", history=_lookup_round("call_b1", "berlin"),
                 ask="Now look up the record 'london'.", tools=["slow_lookup", "search_docs"],
                 narrow=lookup_only),
        Scenario(id="lookup_first_turn", history=[], ask="Look up the record 'nairobi'.",
                 tools=["slow_lookup", "convert_units"], narrow=lookup_only),
        Scenario(id="lookup_named", history=_lookup_round("call_c1", "tokyo"),
                 ask="Please also fetch the record 'berlin'.", tools=["slow_lookup"],
                 narrow=lookup_only, tool_choice="slow_lookup"),
        Scenario(id="capital_then_lookup",
                 history=_capital_round("call_d1", "Japan", "Tokyo"),
                 ask="Look up the record for that city, 'tokyo'.",
                 tools=["slow_lookup", "lookup_capital"], narrow={**lookup_only, **capitals}),
        Scenario(id="capital_followup", history=_capital_round("call_e1", "France", "Paris"),
                 ask="And the capital of Kenya?", tools=["lookup_capital", "slow_lookup"],
                 narrow={**lookup_only, **capitals}),
        Scenario(id="lookup_two_rounds", history=[],
                 ask="Look up the record 'paris', then the record 'london'.",
                 tools=["slow_lookup"], narrow=lookup_only, max_steps=2),
        Scenario(id="convert_followup",
                 history=exchange("call_f1", "Convert 5 km to miles.", "convert_units",
                                  {"value": 5, "from_unit": "km", "to_unit": "mi"},
                                  {"value": 3.10685596119, "unit": "mi",
                                   "dimension": "length"}, "5 km is about 3.11 miles."),
                 ask="And 10 kg in pounds?", tools=["convert_units", "calculator"]),
        Scenario(id="convert_temperature", history=[],
                 ask="Convert 30 degrees C to F.", tools=["convert_units", "slow_lookup"],
                 narrow=lookup_only),
        Scenario(id="calculator_followup",
                 history=exchange("call_g1", "What is 12 * (3 + 4)?", "calculator",
                                  {"expression": "12 * (3 + 4)"}, "84", "It is 84."),
                 ask="Now divide that by 7.", tools=["calculator", "convert_units"]),
        Scenario(id="docs_then_lookup",
                 history=exchange("call_h1", "What do the docs say about speculative decoding?",
                                  "search_docs", {"query": "speculative decoding", "top_k": 1},
                                  [{"id": "spec", "title": "Speculative decoding"}],
                                  "A draft proposes tokens and the model verifies them."),
                 ask="Fetch the record 'london' too.", tools=["slow_lookup", "search_docs"],
                 narrow=lookup_only),
        Scenario(id="lookup_after_two_rounds",
                 history=_lookup_round("call_i1", "paris") + _lookup_round("call_i2", "london"),
                 ask="One more: the record 'tokyo'.", tools=["slow_lookup", "calculator"],
                 narrow=lookup_only),
    ]


SCENARIOS: tuple[Scenario, ...] = tuple(_scenarios())


class MissingToolError(ValueError):
    pass


def request_tool(entry: Mapping[str, Any], narrow: Mapping[str, list[Any]]) -> dict[str, Any]:
    """A `GET /v1/tools` entry as a request tool, string parameters narrowed to enums."""
    function = copy.deepcopy(dict(entry["function"]))
    properties = function.get("parameters", {}).get("properties", {})
    for name, values in narrow.items():
        if name not in properties:
            raise MissingToolError(
                f"tool '{function['name']}' on the server has no parameter '{name}'"
            )
        properties[name]["enum"] = list(values)
    return {"type": "function", "function": function}


def to_case(scenario: Scenario, listing: Mapping[str, Mapping[str, Any]]) -> AgentCase:
    missing = [t for t in scenario.tools if t not in listing]
    if missing:
        raise MissingToolError(
            f"agent scenario '{scenario.id}' needs server tools {missing}, which the server "
            "does not register (GET /v1/tools); deploy app.tools.builtin and the example MCP "
            "server as configs/local.yaml does"
        )
    tools = [request_tool(listing[t], scenario.narrow.get(t, {})) for t in scenario.tools]
    choice: str | dict[str, Any] = scenario.tool_choice
    if choice not in ("required", "auto"):
        choice = {"type": "function", "function": {"name": scenario.tool_choice}}
    messages = [{"role": "system", "content": SYSTEM}, *copy.deepcopy(scenario.history),
                {"role": "user", "content": scenario.ask}]
    return AgentCase(id=f"agent_{scenario.id}", messages=messages, tools=tools,
                     tool_choice=choice, max_steps=scenario.max_steps)


def load_agent_cases(
    listing: Sequence[Mapping[str, Any]], limit: int | None = None,
    scenarios: Sequence[Scenario] = SCENARIOS,
) -> list[AgentCase]:
    """The scenarios as cases, tools taken from `listing` (the `data` of `GET /v1/tools`)."""
    by_name = {entry["function"]["name"]: entry for entry in listing}
    chosen = scenarios if limit is None else scenarios[:limit]
    return [to_case(s, by_name) for s in chosen]
