"""Every route's request checks (app/api/request_checks.py): one set of limits for chat,
completions and responses, and every POST route of the router held to it."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from app.api.errors import ApiError
from app.api.request_checks import ROUTES, Ask, Bounds, Route, check_body, run_checks
from app.api.work import WorkPlan
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest

BOUNDS = Bounds(LimitsConfig(), 1_000_000, 2048)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"prompt": "hi", **extra}


def response(**extra: Any) -> dict[str, Any]:
    return {"input": "hi", **extra}


def message(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": MESSAGES, **extra}


def count(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **extra}


def output_schema(route: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The route's own way to ask for JSON matching `schema`."""
    if route.startswith("/v1/messages"):
        return {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    if route == "/v1/responses":
        return {"text": {"format": {"type": "json_schema", "name": "r", "schema": schema}}}
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "r", "schema": schema}}}


BASE = {"/v1/chat/completions": chat, "/v1/completions": completion, "/v1/responses": response,
        "/v1/messages": message, "/v1/messages/count_tokens": count}


def refused(route: str, data: dict[str, Any], bounds: Bounds = BOUNDS) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_body(ROUTES[route], json.dumps(data).encode(), bounds)
    assert caught.value.status == 400, caught.value.message
    return caught.value


def test_every_post_route_of_the_router_runs_the_shared_checks() -> None:
    # The router takes each POST route's checks from ROUTES (app/api/request_flow.py,
    # `RequestFlow.admitted`): a route missing there would serve without them.
    from deployments.router import api

    posts = {route.path for route in api.routes if "POST" in getattr(route, "methods", ())}
    assert posts, "the router has no POST routes?"
    missing = posts - set(ROUTES)
    assert not missing, f"POST routes without the shared request checks: {sorted(missing)}"
    # and these tests probe every one of them
    assert set(BASE) | set(TOKENIZER) == set(ROUTES)


# vLLM's tokenizer routes (app/api/tokenize.py): no output to constrain, the rest shared.
TOKENIZER = {"/tokenize": lambda **extra: {"messages": MESSAGES, **extra},
             "/detokenize": lambda **extra: {"tokens": [1, 2], **extra}}


@pytest.mark.parametrize("route", sorted(TOKENIZER))
def test_shared_limits_hold_on_the_tokenizer_routes(route: str) -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(80):
        deep = {"a": deep}
    assert refused(route, {"tokens": [deep]} if route == "/detokenize"
                   else TOKENIZER[route](chat_template_kwargs=deep)).code == "body_too_deep"
    assert refused(route, TOKENIZER[route](stream=True)).param == "stream"
    ok = check_body(ROUTES[route], json.dumps(TOKENIZER[route]()).encode(), BOUNDS)
    assert ok.engine_requests == 1


def test_tokenize_takes_a_prompt_or_messages_as_vllm() -> None:
    assert "exactly one" in refused("/tokenize", {"prompt": "a", "messages": MESSAGES}).message
    prompt = check_body(ROUTES["/tokenize"], b'{"prompt": "hi"}', BOUNDS).request
    assert prompt.special_tokens  # vLLM's default for a prompt; false for messages
    chat_form = check_body(ROUTES["/tokenize"], json.dumps({"messages": MESSAGES}).encode(),
                           BOUNDS).request
    assert not chat_form.special_tokens
    assert refused("/tokenize", {"messages": MESSAGES, "continue_final_message": True,
                                 "add_generation_prompt": False})
    assert refused("/detokenize", {"tokens": [-1]}).param == "tokens"


@pytest.mark.parametrize("route", sorted(BASE))
def test_shared_limits_hold_on_every_route(route: str) -> None:
    base = BASE[route]
    deep: dict[str, Any] = {"a": 1}
    for _ in range(80):
        deep = {"a": deep}
    assert refused(route, base(metadata=deep)).code == "body_too_deep"
    bad = refused(route, base(**output_schema(route, {"type": "nope"})))
    assert bad.param == "response_format"
    huge = {"type": "object", "description": "x" * 70_000}
    assert refused(route, base(**output_schema(route, huge))).code == "tool_schema_too_large"
    ok = check_body(ROUTES[route], json.dumps(base(**output_schema(route, SCHEMA))).encode(),
                    BOUNDS)
    assert ok.ask.chat.output_schema == SCHEMA and ok.engine_requests == 1


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_stop_strings_are_counted_and_never_empty(route: str) -> None:
    base = BASE[route]
    assert refused(route, base(stop=[""])).code == "empty_stop_string"
    assert refused(route, base(stop="")).code == "empty_stop_string"
    many = refused(route, base(stop=[f"s{i}" for i in range(20_000)]))
    assert many.code == "too_many_stop_strings" and many.param == "stop"
    check_body(ROUTES[route], json.dumps(base(stop=["a", "b"])).encode(), BOUNDS)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_the_last_choice_seed_is_in_range(route: str) -> None:
    base = BASE[route]
    err = refused(route, base(seed=2**63 - 1, n=2))
    assert err.code == "seed_out_of_range" and err.param == "seed"
    assert refused(route, base(seed=2**64)).param == "seed"
    assert refused(route, base(seed=-(2**63) - 1)).param == "seed"
    for seed, n in [(2**63 - 1, 1), (2**63 - 2, 2), (-(2**63), 3)]:
        check_body(ROUTES[route], json.dumps(base(seed=seed, n=n)).encode(), BOUNDS)


def test_completion_choices_count_prompts_times_n() -> None:
    err = refused("/v1/completions", completion(prompt=["a", "b", "c"], n=3))
    assert err.code == "too_many_choices" and "9 choices" in err.message
    # Every prompt's choice i samples with seed + i: n seeds, not prompts x n.
    check_body(ROUTES["/v1/completions"], json.dumps(completion(
        prompt=["a", "b", "c"], n=2, seed=2**63 - 2)).encode(), BOUNDS)


def test_tokens_and_logprobs_over_all_choices_are_limited() -> None:
    limits = LimitsConfig(max_request_tokens=1000, max_logprob_entries=500)
    bounds = Bounds(limits, 1_000_000, 2048)
    err = refused("/v1/chat/completions", chat(n=4, max_tokens=300), bounds)
    assert err.code == "too_many_tokens_requested" and "max_request_tokens" in err.message
    check_body(ROUTES["/v1/chat/completions"], json.dumps(chat(n=4, max_tokens=250)).encode(),
               bounds)
    # Without max_tokens a choice counts the server's ceiling (min(limits.max_tokens, context)).
    assert refused("/v1/completions", completion(max_tokens=None), bounds).code == \
        "too_many_tokens_requested"
    err = refused("/v1/chat/completions",
                  chat(max_tokens=100, logprobs=True, top_logprobs=6), bounds)
    assert err.code == "too_many_logprobs" and "max_logprob_entries" in err.message
    assert refused("/v1/completions", completion(max_tokens=100, logprobs=6), bounds).code == \
        "too_many_logprobs"
    check_body(ROUTES["/v1/completions"], json.dumps(completion(
        max_tokens=100, logprobs=5)).encode(), bounds)


def test_engine_requests_count_choices_and_sidecar_slots() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in "abcde"}}}}
    slots = Bounds(LimitsConfig(), 1_000_000, 2048, work=WorkPlan(True, 32))

    def engine_requests(data: dict[str, Any], bounds: Bounds = slots) -> int:
        return check_body(ROUTES["/v1/chat/completions"], json.dumps(data).encode(),
                          bounds).engine_requests

    forced = chat(tools=[tool], tool_choice="required", n=3, max_tokens=8)
    assert engine_requests(forced) == 3 * (1 + 5)  # each choice: main + a slot per property
    assert engine_requests({**forced, "tool_choice": "auto"}) == 3 * 2  # one prediction
    assert engine_requests({**forced, "ooo_spec": {"sidecar": False}}) == 3
    assert engine_requests(forced, Bounds(LimitsConfig(), 1_000_000, 2048)) == 3  # no sidecar
    few = Bounds(LimitsConfig(), 1_000_000, 2048, work=WorkPlan(True, 4))
    assert engine_requests(forced, few) == 3 * (1 + 2)  # past the slot cap: no slots
    assert engine_requests(chat(n=2)) == 2


async def test_checks_run_off_the_event_loop() -> None:
    # The route's parse and every shared check run in the worker thread run_checks starts.
    threads: list[int] = []

    def parse(data: dict[str, Any]) -> ChatCompletionRequest:
        threads.append(threading.get_ident())
        return ChatCompletionRequest.model_validate(data)

    route = Route("probe", parse, lambda r: Ask(r, 1, 1))
    checked = await run_checks(route, json.dumps(chat()).encode(), BOUNDS)
    assert checked.request.messages[0].content == "hi"
    assert threads and threads[0] != threading.get_ident()


def test_reasoning_in_history_is_accepted_on_assistant_turns_only() -> None:
    """Issue 41: `reasoning` / `reasoning_content` on earlier assistant turns (vLLM's new and
    old names; `reasoning` wins, as in vLLM); on any other role a 400."""
    from pydantic import ValidationError

    from app.openai_models import ChatMessage

    old = ChatMessage.model_validate(
        {"role": "assistant", "content": "Hi", "reasoning_content": "greet"})
    assert (old.reasoning, old.model_dump(exclude_none=True).get("reasoning_content")) == (
        "greet", None)
    both = ChatMessage.model_validate(
        {"role": "assistant", "content": "Hi", "reasoning": "new", "reasoning_content": "old"})
    assert both.reasoning == "new"
    with pytest.raises(ValidationError, match="only 'assistant' messages"):
        ChatMessage.model_validate({"role": "user", "content": "Hi", "reasoning": "x"})
