"""End to end: the real app on Ray Serve, the real embedded model, the real `openai` client."""

from __future__ import annotations

import json

import httpx
import pytest

from app.speculation.validation import validate_arguments

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def test_required_tool_call_is_parsed_and_valid(openai_client) -> None:  # type: ignore[no-untyped-def]
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    arguments = json.loads(calls[0].function.arguments)
    assert validate_arguments(arguments, WEATHER["function"]["parameters"]) == []
    report = response.model_extra["ooo_spec"]
    assert report["main"]["steps"] >= 1
    assert report["main"]["completion_tokens"] == response.usage.completion_tokens
    # sidecar_skipped: the router's gate found another request's sidecar call pending.
    assert report["outcome"] in {"hit", "partial", "miss", "sidecar_late", "sidecar_error",
                                 "sidecar_skipped"}


def test_named_tool_choice_and_disabled_speculation(openai_client) -> None:  # type: ignore[no-untyped-def]
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
        extra_body={"ooo_spec": {"enabled": False}},
    )
    calls = response.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    report = response.model_extra["ooo_spec"]
    assert report["enabled"] is False and report["outcome"] == "disabled"
    assert report["main"]["drafted_tokens"] == 0


def test_a_follow_up_turn_reports_its_replica_and_prefix_cache_hit(openai_client) -> None:  # type: ignore[no-untyped-def]
    """An agent's next turn (its last turn plus a tool result) on the replica that served it:
    the prefix cache served the shared prompt, as `usage.prompt_tokens_details` tells the
    `openai` client and `ooo_spec.routing` tells where it ran."""
    first = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=MESSAGES, tools=[WEATHER],
        tool_choice="required", temperature=0, max_tokens=48)
    [call] = first.choices[0].message.tool_calls
    follow_up = [*MESSAGES,
                 {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, light rain"}]
    second = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=follow_up, tools=[WEATHER],
        temperature=0, max_tokens=16)
    [before] = first.model_extra["ooo_spec"]["routing"]
    [route] = second.model_extra["ooo_spec"]["routing"]
    # One MainModel replica, routed by cache affinity as configs/local.yaml sets it: the
    # follow-up's longest known prefix is the first turn's prompt (its tools and question).
    assert route["replica"] and route["replica"] == before["replica"]
    assert route["decision"] == "affinity" and route["matched_chars"] >= 256, route
    assert route["prompt_tokens"] == second.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens and route["cached_tokens"] == cached


def test_plain_chat_without_tools(openai_client) -> None:  # type: ignore[no-untyped-def]
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "Say hello."}],
        temperature=0,
        max_tokens=8,
    )
    assert response.choices[0].message.content
    assert response.usage.completion_tokens <= 8


def test_streaming_chunks_are_well_formed(openai_client, app_url: str) -> None:  # type: ignore[no-untyped-def]
    stream = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    tool_deltas = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert tool_deltas and tool_deltas[0].choices[0].delta.tool_calls[0].function.name
    assert any(c.choices and c.choices[0].finish_reason == "tool_calls" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert "ooo_spec" in chunks[-1].model_extra

    # The raw wire: every event is `data: <json>` and the last one is `data: [DONE]`.
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required",
            "temperature": 0, "max_tokens": 64, "stream": True}
    with httpx.stream("POST", f"{app_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    for line in events[:-1]:
        assert line.startswith("data: ")
        assert json.loads(line[len("data: "):])["object"] == "chat.completion.chunk"


def test_models_and_health(app_url: str) -> None:
    assert httpx.get(f"{app_url}/healthz").json() == {"status": "ok"}
    models = httpx.get(f"{app_url}/v1/models").json()
    assert models["data"][0]["id"] == "smollm2-135m-instruct"


def test_reasoning_in_history_is_served(openai_client) -> None:  # type: ignore[no-untyped-def]
    """Issue 41: an agent of an interleaved-thinking model sends its earlier turns back with
    their `reasoning_content` (and `reasoning`): served (200), not refused."""
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
               {"role": "assistant", "content": "It is 18 degrees.", "reasoning": "Short."},
               {"role": "user", "content": "Thanks!"}]
    response = openai_client.chat.completions.with_raw_response.create(
        model="smollm2-135m-instruct", messages=history, tools=[WEATHER], temperature=0,
        max_tokens=8)
    assert response.http_response.status_code == 200
    assert response.parse().choices[0].finish_reason in {"stop", "length", "tool_calls"}


def test_a_codex_shaped_responses_request_completes(openai_client) -> None:  # type: ignore[no-untyped-def]
    """Issue 42: what Codex sends on /v1/responses (store false, reasoning, include,
    prompt_cache_key, parallel_tool_calls false, a function and a free-form tool)."""
    response = openai_client.responses.create(
        model="smollm2-135m-instruct",
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is the weather in Paris, in celsius?"}]}],
        instructions="You are a coding agent.", store=False,
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"], prompt_cache_key="codex-e2e",
        parallel_tool_calls=False, tool_choice="required", max_output_tokens=64,
        tools=[{"type": "function", "name": "get_weather",
                "parameters": WEATHER["function"]["parameters"], "strict": False},
               {"type": "custom", "name": "apply_patch", "description": "Edit files"}],
        temperature=0)
    assert response.status in ("completed", "incomplete")  # incomplete: cut at the limit
    if response.status == "completed":  # a forced call: one of the two tools
        assert response.output[-1].type in ("function_call", "custom_tool_call")
    assert response.store is False and response.model_extra["ooo_spec"]["outcome"]


def test_vllms_own_endpoints(app_url: str) -> None:
    """vLLM's `/health`, `/version`, `/tokenize` and `/detokenize`, in vLLM's shapes."""
    assert httpx.get(f"{app_url}/health").status_code == 200
    assert httpx.get(f"{app_url}/version").json()["version"]
    by_prompt = httpx.post(f"{app_url}/tokenize", json={
        "prompt": "Hello world", "return_token_strs": True}).json()
    assert by_prompt["count"] == len(by_prompt["tokens"]) == len(by_prompt["token_strs"]) > 0
    assert by_prompt["max_model_len"] >= by_prompt["count"]
    text = httpx.post(f"{app_url}/detokenize", json={"tokens": by_prompt["tokens"]}).json()
    assert text["prompt"].endswith("Hello world")
    chat = httpx.post(f"{app_url}/tokenize", json={"messages": MESSAGES, "tools": [WEATHER]})
    assert chat.json()["count"] > by_prompt["count"]  # the template and the tools
    bad = httpx.post(f"{app_url}/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_vllms_sampling_fields_are_served(openai_client) -> None:  # type: ignore[no-untyped-def]
    """Issue 42: the sampling extras are accepted; min_p decodes without drafts and says why."""
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=MESSAGES, tools=[WEATHER],
        tool_choice="required", temperature=0, max_tokens=32,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1,
                    "session_id": "s-1", "cache_salt": "mine"})
    report = response.model_extra["ooo_spec"]
    assert "min_p" in report["no_drafts_reason"] and report["main"]["drafted_tokens"] == 0
