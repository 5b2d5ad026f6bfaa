"""The client libraries agent stacks are built on, against the running app (embedded model):
the `openai` SDK (chat, completions, responses, streaming), LangChain (`bind_tools`,
`with_structured_output` both ways, streaming), the OpenAI Agents SDK (its chat-completions and
its Responses model, a tool loop, streaming), pydantic-ai (a tool and a structured output).

A 135M model writes what it writes; the assertions check the API surface (shapes, parsing,
the tool loop's wiring), and that the libraries get well-formed answers they can parse."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}}


class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


CITY_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
    "required": ["name", "country"], "additionalProperties": False}
ASK_CITY = [{"role": "user", "content": "Paris is the capital of France. Describe Paris."}]


@pytest.fixture(scope="module")
def base_url(app_url: str) -> str:
    return f"{app_url}/v1"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", timeout=180, max_retries=0)


@pytest.fixture
def async_client(base_url: str) -> openai.AsyncOpenAI:
    # Per test: an async client's connections belong to the event loop of the test that
    # opened them.
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", timeout=180, max_retries=0)


# ----- openai SDK ---------------------------------------------------------------------------
def test_openai_response_format_json_schema(client: openai.OpenAI) -> None:
    parsed = client.chat.completions.parse(
        model=MODEL, messages=ASK_CITY, response_format=City, temperature=0, max_tokens=64)
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City)
    # Streaming: the same text (greedy), in pieces.
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK_CITY, temperature=0, max_tokens=64, stream=True,
        response_format={"type": "json_schema", "json_schema": {
            "name": "City", "schema": City.model_json_schema(), "strict": True}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert City.model_validate_json(text) == city
    obj = client.chat.completions.create(
        model=MODEL, messages=ASK_CITY, temperature=0, max_tokens=64,
        response_format={"type": "json_object"})
    content = obj.choices[0].message.content or ""
    assert content.startswith("{")
    if obj.choices[0].finish_reason == "stop":  # else max_tokens cut a long string value
        assert isinstance(json.loads(content), dict)


def test_openai_no_max_tokens_is_not_cut_at_256(client: openai.OpenAI) -> None:
    # A JSON object forced without max_tokens: vLLM's default is the rest of the context.
    response = client.chat.completions.create(
        model=MODEL, messages=ASK_CITY, temperature=0,
        response_format={"type": "json_schema", "json_schema": {
            "name": "City", "schema": CITY_SCHEMA}})
    assert response.choices[0].finish_reason == "stop"
    City.model_validate_json(response.choices[0].message.content or "")


def test_openai_logprobs_and_n(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], temperature=0,
        max_tokens=8, logprobs=True, top_logprobs=3, n=2, seed=1)
    assert [c.index for c in response.choices] == [0, 1]
    assert response.choices[0].message.content == response.choices[1].message.content
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) * 2 == response.usage.completion_tokens  # type: ignore[union-attr]
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    # The greedy token is the most likely one.
    assert all(t.top_logprobs[0].token == t.token for t in content)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], temperature=0,
        max_tokens=8, logprobs=True, top_logprobs=1, stream=True)
    streamed = [t.token for c in stream if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or []]
    assert streamed == [t.token for t in content]


def test_openai_completions(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=8, temperature=0, logprobs=2)
    text = done.choices[0].text
    assert text and done.usage and done.usage.completion_tokens == 8
    assert done.choices[0].finish_reason == "length"
    assert len(done.choices[0].logprobs.tokens or []) == 8  # type: ignore[union-attr]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True) if c.choices)
    assert streamed == text
    default = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert default.usage and default.usage.completion_tokens == 16  # vLLM's default


def test_openai_responses(client: openai.OpenAI) -> None:
    answer = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=12,
                                     temperature=0, instructions="Answer in one sentence.")
    assert answer.output_text and answer.usage and answer.usage.output_tokens <= 12
    tool = {"type": "function", "name": "get_weather",
            "description": WEATHER["function"]["description"],
            "parameters": WEATHER["function"]["parameters"]}
    call = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[tool],  # type: ignore[list-item]
        tool_choice="required", temperature=0, max_output_tokens=48)
    calls = [o for o in call.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments)
    # The call's result back as items: the model answers (text or another call).
    follow = client.responses.create(
        model=MODEL, tools=[tool], temperature=0, max_output_tokens=32,  # type: ignore[list-item]
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "Sunny, 21 C"}])
    assert follow.output and follow.status in ("completed", "incomplete")
    events = list(client.responses.create(model=MODEL, input="Say hello.", stream=True,
                                          max_output_tokens=12, temperature=0))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")


def test_openai_bad_requests_still_400(base_url: str) -> None:
    for route, body in (("/chat/completions", {"messages": ASK_CITY, "top_logprobs": 2}),
                        ("/completions", {"prompt": "x", "echo": True}),
                        ("/responses", {"input": [{"type": "reasoning"}]})):
        reply = httpx.post(base_url + route, json=body, timeout=60)
        assert reply.status_code == 400, (route, reply.text)
        assert reply.json()["error"]["message"]


# ----- LangChain ----------------------------------------------------------------------------
def _langchain(base_url: str, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused",  # type: ignore[arg-type]
                      temperature=0, timeout=180, max_retries=0, **kw)


def test_langchain_bind_tools_invoke_and_stream(base_url: str) -> None:
    llm = _langchain(base_url, max_tokens=48).bind_tools([WEATHER], tool_choice="required")
    message = llm.invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    merged = None
    for piece in llm.stream("What is the weather in Paris?"):
        merged = piece if merged is None else merged + piece
    assert merged is not None  # greedy: the same call, streamed (ids differ per request)
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [
        (c["name"], c["args"]) for c in message.tool_calls]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(base_url: str, method: str) -> None:
    # No max_tokens: the server's default (the rest of the context) and the bounded
    # whitespace let the model finish its JSON.
    structured = _langchain(base_url).with_structured_output(City, method=method)
    city = structured.invoke("Paris is the capital of France. Describe Paris.")
    assert isinstance(city, City)


# ----- OpenAI Agents SDK --------------------------------------------------------------------
def _agent(async_client: openai.AsyncOpenAI, responses: bool, calls: list[str]) -> Any:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no export to the OpenAI platform

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"Sunny, 21 C in {city}"

    model = (OpenAIResponsesModel(model=MODEL, openai_client=async_client) if responses
             else OpenAIChatCompletionsModel(model=MODEL, openai_client=async_client))
    # The first turn must call the tool; the SDK then resets tool_choice so the second turn
    # can answer in text from the tool's result.
    return Agent(name="weather", instructions="Answer weather questions with the tool.",
                 tools=[get_weather], model=model,
                 model_settings=ModelSettings(tool_choice="required", temperature=0,
                                              max_tokens=48))


@pytest.mark.parametrize("responses", [False, True], ids=["chat_completions", "responses"])
async def test_agents_sdk_tool_loop(async_client: openai.AsyncOpenAI, responses: bool) -> None:
    from agents import Runner

    calls: list[str] = []
    result = await Runner.run(_agent(async_client, responses, calls),
                              "What is the weather in Paris?", max_turns=4)
    assert calls, "the model never called the tool"
    assert len(result.raw_responses) >= 2  # the tool's result went back to the model
    assert isinstance(result.final_output, str)


@pytest.mark.parametrize("responses", [False, True], ids=["chat_completions", "responses"])
async def test_agents_sdk_streaming(async_client: openai.AsyncOpenAI, responses: bool) -> None:
    from agents import Runner

    calls: list[str] = []
    run = Runner.run_streamed(_agent(async_client, responses, calls),
                              "What is the weather in Paris?", max_turns=4)
    kinds = [event.type async for event in run.stream_events()]
    assert calls and "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert isinstance(run.final_output, str)


# ----- pydantic-ai --------------------------------------------------------------------------
def test_pydantic_ai_tool_and_structured_output(base_url: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    looked_up: list[str] = []
    # No max_tokens (pydantic-ai sends none): the server's default must let the JSON finish.
    agent = Agent(model, output_type=City, model_settings={"temperature": 0},
                  instructions="Look the city's country up with the tool, then answer.")

    @agent.tool_plain
    def country_of(city: str) -> str:
        """The country a city is in."""
        looked_up.append(city)
        return "France"

    result = agent.run_sync("Describe Paris.", usage_limits=UsageLimits(request_limit=6))
    assert isinstance(result.output, City)
