"""Hypothesis fuzz of the HTTP API: whatever a client sends, the answer is never a 5xx and
never a hang, error bodies are the OpenAI envelope, and the server keeps serving.

Requests are drawn three ways: valid chat requests with one part replaced, dropped or added
(the interesting region: mostly valid, so they reach the deeper checks and sometimes the
engines), arbitrary JSON, and arbitrary bytes. Generations stay short (`max_tokens` <= 8 unless
a mutation removes it) so a run takes about a minute."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.api.completions import CompletionRequest
from app.api.responses import ResponsesRequest
from app.openai_models import ChatCompletionRequest
from tests import request_bodies
from tests.e2e.cluster import GOOD, chat

pytestmark = pytest.mark.e2e

REQUEST_TIMEOUT_S = 180  # a hang shows up as a timeout, which fails the test

scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(
        ["string", "integer", "number", "boolean", "null", "strng"])},
        optional={"enum": st.lists(scalars, min_size=1, max_size=3),
                  "minimum": st.integers(-5, 5), "maximum": st.integers(-5, 5),
                  "minLength": st.integers(0, 4), "maxLength": st.integers(0, 4),
                  "pattern": st.sampled_from(["^a+$", "[0-9]{2}", "((", "(a|b)*c"]),
                  "format": st.sampled_from(["date-time", "uri", "email", "no-such"])}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"),
         "properties": st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner,
                                       max_size=3)},
        optional={"required": st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                                       max_size=2),
                  "additionalProperties": st.booleans()})
    | st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                            optional={"minItems": st.integers(0, 3)}),
    max_leaves=6,
)
tools = st.builds(
    lambda name, params: {"type": "function", "function": {"name": name, "parameters": params}},
    st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    st.one_of(schemas.map(lambda s: {"type": "object", "properties": {"x": s},
                                     "required": ["x"]}), schemas),
)
messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool", "robot"]),
    "content": st.one_of(st.text(max_size=40), st.none(), json_values)},
    optional={"tool_call_id": st.text(max_size=8), "name": st.text(max_size=8)}),
    min_size=0, max_size=3)
valid_requests = st.fixed_dictionaries(
    {"messages": st.just(copy.deepcopy(GOOD["messages"])) | messages,
     "max_tokens": st.integers(1, 8)},
    optional={
        "tools": st.lists(tools, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required"])
        | st.builds(lambda n: {"type": "function", "function": {"name": n}},
                    st.sampled_from(["lookup", "nope"])),
        "temperature": st.floats(-1, 3, allow_nan=False),
        "top_p": st.floats(-0.5, 1.5, allow_nan=False),
        "seed": st.integers(-(2**63), 2**64),
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=5),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "n": st.integers(0, 3),
        "parallel_tool_calls": st.booleans(),
        "model": st.sampled_from(["smollm2-135m-instruct", "gpt-x", ""]),
        "ooo_spec": st.fixed_dictionaries({}, optional={
            "enabled": st.booleans(), "execute_tools": st.booleans(),
            "max_steps": st.integers(-1, 20), "baseline": st.sampled_from(["ngram", "other"]),
            "frob": st.booleans()}),
    },
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    request = draw(valid_requests)
    action = draw(st.sampled_from(["keep", "replace", "drop", "add"]))
    if action == "replace" and request:
        request[draw(st.sampled_from(sorted(request)))] = draw(json_values)
    elif action == "drop" and request:
        request.pop(draw(st.sampled_from(sorted(request))))
    elif action == "add":
        request[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    if not (isinstance(request.get("max_tokens"), int) and 1 <= request["max_tokens"] <= 8):
        # max_tokens dropped or replaced (null means the model's whole context): the request
        # still carries the odd value, and max_completion_tokens, which takes precedence,
        # keeps the generation short, so a loaded machine cannot turn it into a timeout.
        request.setdefault("max_completion_tokens", 8)
    return request


bodies = st.one_of(
    mutated().map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)


def check_response(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        return
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        for line in lines[:-1]:
            event = json.loads(line[6:])
            # An error after the headers went out: it must say what went wrong, and not be a
            # server failure on a request the server accepted.
            assert "error" not in event or event["error"]["type"] != "server_error", event
    else:
        assert response.json()["object"] == "chat.completion"


@settings(max_examples=70, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=bodies)
def test_fuzzed_chat_requests_never_get_a_5xx(app_url: str, body: bytes) -> None:
    response = httpx.post(f"{app_url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"},
                          timeout=REQUEST_TIMEOUT_S)
    check_response(response)


# Issue 20: sampling parameters over and past their ranges, and schema shapes that cost work
# (references, combinators, repeats, patterns), on otherwise valid forced calls.
sampling = st.fixed_dictionaries({}, optional={
    "seed": st.integers(-(2**65), 2**65),
    "temperature": st.floats(-1, 3, allow_nan=False) | st.sampled_from([0.0, 2.0]),
    "top_p": st.floats(-0.5, 1.5, allow_nan=False),
    "max_tokens": st.integers(-2, 10),
    "stop": st.lists(st.text(max_size=200), max_size=6),
    "n": st.integers(-1, 3),
})
patterns = st.sampled_from(["^(a+)+$", "(a|aa)+", "([a-z]+,)+", r"(a)\1", "[0-9]{2}",
                            "a{1001}", "x" * 600, "(ab+)*", r"^\w+$"])
shapes = st.recursive(
    st.fixed_dictionaries({"type": st.just("string")}, optional={"pattern": patterns,
                                                                 "maxLength": st.integers(0, 9)})
    | st.just({"$ref": "#/$defs/d0"}),
    lambda inner: st.builds(lambda kind, items: {kind: items},
                            st.sampled_from(["allOf", "anyOf", "oneOf"]),
                            st.lists(inner, min_size=1, max_size=3))
    | st.builds(lambda p: {"type": "object", "properties": {"v": p}}, inner),
    max_leaves=5,
)


@st.composite
def costly_schemas(draw: st.DrawFn) -> dict[str, Any]:
    levels = draw(st.integers(0, 30))
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2}
                            for i in range(levels)}
    defs[f"d{levels}"] = draw(shapes.filter(lambda s: "$ref" not in json.dumps(s)))
    return {"type": "object", "properties": {"key": draw(shapes)}, "required": ["key"],
            "$defs": defs}


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=sampling, schema=costly_schemas(), stream=st.booleans())
def test_fuzzed_sampling_and_schema_shapes_never_get_a_5xx(
    app_url: str, params: dict[str, Any], schema: dict[str, Any], stream: bool
) -> None:
    body = {**GOOD, "max_tokens": 8, **params, "stream": stream,
            "tools": [{"type": "function", "function": {"name": "lookup",
                                                        "parameters": schema}}]}
    response = httpx.post(f"{app_url}/v1/chat/completions", json=body,
                          timeout=REQUEST_TIMEOUT_S)
    check_response(response)


@settings(max_examples=25, deadline=None, database=None)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
       path=st.sampled_from(["/v1/models", "/v1/tools", "/v1/chat/completions", "/healthz",
                             "/v1/models/x", "/v1", "/"])
       | st.from_regex(r"/[a-z0-9/%._-]{0,30}", fullmatch=True),
       body=st.binary(max_size=32))
def test_fuzzed_routes_and_methods_never_get_a_5xx(app_url: str, method: str, path: str,
                                                  body: bytes) -> None:
    response = httpx.request(method, f"{app_url}{path}", content=body, timeout=60)
    assert response.status_code < 500, (method, path, response.text[:300])


# Issue 39: bodies drawn from each route's request model (tests/request_bodies.py, the same
# generator as the in-process fuzz in tests/unit/test_body_fuzz.py), valid and mutated, through
# the running app: no 5xx, no hang. Generations are capped (`capped`) so the run stays near
# 20 s; most bodies are refused before any engine work.
ROUTE_MODELS: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatCompletionRequest,
                                            "/v1/completions": CompletionRequest,
                                            "/v1/responses": ResponsesRequest}
ROUTE_LIMITS = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens",
                "/v1/responses": "max_output_tokens"}
ROUTE_BODIES = 20  # per route


def capped(route: str) -> st.SearchStrategy[bytes]:
    field = ROUTE_LIMITS[route]

    def short(body: Any) -> Any:
        """At most 4 tokens for at most 2 choices of at most 2 prompts, after the mutation
        (an odd value stays: it is refused before any engine work)."""
        if not isinstance(body, dict):
            return body
        if body.get(field) is None or (isinstance(body[field], int) and body[field] > 4):
            body[field] = 4
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
        if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 2:
            body["prompt"] = body["prompt"][:2]
        return body

    valid = request_bodies.TYPICAL[route] | request_bodies.from_json_schema(
        ROUTE_MODELS[route].model_json_schema())
    return request_bodies.bodies(valid, short)


@pytest.mark.parametrize("route", sorted(ROUTE_LIMITS))
def test_fuzzed_bodies_on_every_route_never_get_a_5xx(app_url: str, route: str) -> None:
    statuses: dict[int, int] = {}

    @settings(max_examples=ROUTE_BODIES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=capped(route))
    def run(body: bytes) -> None:
        response = httpx.post(f"{app_url}{route}", content=body, timeout=60,
                              headers={"content-type": "application/json"})
        assert response.status_code < 500, (response.text[:300], body[:300])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["code"] != "check_failed", error
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    run()
    print(f"{route}: {sum(statuses.values())} bodies through the app: {statuses}")
    ok = httpx.post(f"{app_url}/v1/completions", timeout=60,
                    json={"prompt": "The capital of France is", "max_tokens": 1})
    assert ok.status_code == 200, ok.text


def test_server_still_serves_after_the_fuzz(app_url: str) -> None:
    response = chat(app_url, GOOD)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["tool_calls"]
