"""No body makes the request checks fail unforeseen (issue 39): the checks parse, validate every
client schema, then count work; anything a check did not foresee is a 400 naming the field;
text that cannot be encoded, JSON edge cases and text parts without text are 400s on every
route, through the `check_body` the router runs (app/api/request_checks.py)."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest

from app.api import request_checks
from app.api.errors import ApiError
from app.api.request_checks import ROUTES, Bounds, Route, check_body
from app.api.work import WorkPlan
from app.config import LimitsConfig

# The sidecar deployed in slots mode: the work count reads a forced tool's properties.
BOUNDS = Bounds(LimitsConfig(), 1_000_000, 2048, work=WorkPlan(True, 32))
HELLO = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}}}
BROKEN = {"type": "objectt", "properties": 5}  # issue 39's regression
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


def tool(parameters: dict[str, Any], description: str = "d") -> dict[str, Any]:
    return {"type": "function", "function": {"name": "x", "description": description,
                                             "parameters": parameters}}


def refused(path: str, body: dict[str, Any] | str) -> ApiError:
    raw = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(ApiError) as caught:
        check_body(ROUTES[path], raw.encode(), BOUNDS)
    assert 400 <= caught.value.status < 500, caught.value.message
    return caught.value


def accepted(path: str, body: dict[str, Any]) -> None:
    check_body(ROUTES[path], json.dumps(body).encode(), BOUNDS)


def test_an_invalid_tool_schema_is_refused_before_the_work_count_reads_it() -> None:
    body = {"messages": HELLO, "tools": [tool(BROKEN)], "tool_choice": "required"}
    with mock.patch.object(request_checks, "work_of", wraps=request_checks.work_of) as work:
        err = refused(CHAT, body)
        assert err.param == "tools" and "not a valid JSON Schema" in err.message
        assert work.call_count == 0  # the schema was refused before any work was counted
        accepted(CHAT, {**body, "tools": [tool(SCHEMA)]})
        assert work.call_count == 1
    responses = {"input": "hi", "tools": [{"type": "function", "name": "x",
                                            "parameters": BROKEN}], "tool_choice": "required"}
    assert refused(RESPONSES, responses).param == "tools"


@pytest.mark.parametrize(("target", "field"), [
    ("work_of", "tools"), ("check_tools", "tools"), ("check_stop", "stop"),
    ("check_messages", "messages"), ("check_max_tokens", "max_tokens"),
    ("check_output_schema", "response_format"), ("check_schema", "tools"),
])
def test_an_exception_inside_a_check_is_a_400_naming_its_field(target: str,
                                                              field: str) -> None:
    body = ({"messages": HELLO, "response_format": {"type": "json_object"}}
            if target == "check_output_schema"
            else {"messages": HELLO, "tools": [tool(SCHEMA)], "tool_choice": "required"})
    with mock.patch.object(request_checks, target, side_effect=TypeError("boom")):
        err = refused(CHAT, body)
    assert err.status == 400 and err.code == "check_failed" and err.param == field
    assert "TypeError" in err.message and "boom" not in err.message  # no internals


def test_an_exception_in_a_routes_parse_is_a_400_for_the_body() -> None:
    def parse(data: dict[str, Any]) -> Any:
        raise KeyError("x")

    route = Route("probe", parse, lambda request: request)
    with pytest.raises(ApiError) as caught:
        check_body(route, b'{"a": 1}', BOUNDS)
    assert caught.value.status == 400 and caught.value.param is None
    assert caught.value.code == "check_failed"


# Where text travels on each route: a message, a tool's description, a tool's schema, the
# output format's schema (and a completions prompt, a responses input item).
SURROGATE = "a\ud800"
TEXT_PLACES: list[tuple[str, str, dict[str, Any]]] = [
    (CHAT, "messages[0].content", {"messages": [{"role": "user", "content": SURROGATE}]}),
    (CHAT, "messages[0].content[0].text", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": SURROGATE}]}]}),
    (CHAT, "tools[0].function.description", {"messages": HELLO,
                                             "tools": [tool(SCHEMA, SURROGATE)]}),
    (CHAT, "tools[0].function.parameters.properties.key.description", {
        "messages": HELLO, "tools": [tool({"type": "object", "properties": {
            "key": {"type": "string", "description": SURROGATE}}})]}),
    (CHAT, "response_format.json_schema.schema.title", {
        "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"type": "object", "title": SURROGATE}}}}),
    (COMPLETIONS, "prompt", {"prompt": SURROGATE}),
    (COMPLETIONS, "prompt[1]", {"prompt": ["ok", SURROGATE]}),
    (COMPLETIONS, "response_format.json_schema.schema.enum[0]", {
        "prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"enum": [SURROGATE]}}}}),
    (RESPONSES, "input", {"input": SURROGATE}),
    (RESPONSES, "input[0].content[0].text", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": SURROGATE}]}]}),
    (RESPONSES, "tools[0].description", {"input": "hi", "tools": [
        {"type": "function", "name": "x", "description": SURROGATE, "parameters": SCHEMA}]}),
    (RESPONSES, "tools[0].parameters.properties.key.pattern", {"input": "hi", "tools": [
        {"type": "function", "name": "x", "parameters": {
            "type": "object", "properties": {"key": {"type": "string",
                                                     "pattern": SURROGATE}}}}]}),
    (RESPONSES, "text.format.schema.description", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "r", "schema": {"description": SURROGATE}}}}),
]


@pytest.mark.parametrize(("path", "where", "body"), TEXT_PLACES,
                         ids=[f"{p}:{w}" for p, w, _ in TEXT_PLACES])
def test_text_that_cannot_be_encoded_is_refused_where_it_is(path: str, where: str,
                                                            body: dict[str, Any]) -> None:
    err = refused(path, body)
    assert err.code == "invalid_text" and err.param == where, err.message
    # The same body with the surrogate written as a proper character passes.
    accepted(path, json.loads(json.dumps(body).replace("\\ud800", "\\u00e9")))


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_every_route_refuses_unencodable_text_and_json_edge_cases(path: str) -> None:
    # Refused before the route's own model reads the body, so any body shape shows it.
    assert refused(path, {"x": "\udfff"}).code == "invalid_text"
    assert refused(path, {"x\ud800": 1}).code == "invalid_text"
    big = refused(path, '{"seed": %s, "max_tokens": 1}' % ("9" * 5000))
    assert big.code == "number_too_long" and big.param == "seed"
    big = refused(path, '{"max_tokens": %s}' % ("1" * 5000))
    assert big.code == "number_too_long" and big.param == "max_tokens"
    assert refused(path, '{"temperature": NaN}').code == "invalid_number"
    assert refused(path, '{"temperature": Infinity}').code == "invalid_number"
    assert refused(path, '{"temperature": 1e999}').code == "number_too_large"
    assert refused(path, '{"model": "a", "model": "b"}').code == "duplicate_key"
    assert refused(path, "[" * 50_000 + "]" * 50_000).code == "body_too_deep"


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": None},
                                  {"type": "text", "text": 5}, {"type": "text", "text": ["a"]},
                                  {"text": "no type"}, {"type": 3, "text": "x"}])
def test_chat_text_parts_need_their_text_as_a_string(part: dict[str, Any]) -> None:
    err = refused(CHAT, {"messages": [{"role": "user", "content": [part]}]})
    assert err.param == "messages.0.content" and "content part 0" in err.message
    accepted(CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}]})


@pytest.mark.parametrize("part", [{"type": "input_text"}, {"type": "input_text", "text": None},
                                  {"type": "input_text", "text": 5}, {"type": "refusal"}])
def test_responses_text_parts_need_their_text(part: dict[str, Any]) -> None:
    err = refused(RESPONSES, {"input": [{"role": "user", "content": [part]}]})
    assert err.param == "input[0]"
    accepted(RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "hi"}]}]})


def test_completions_cannot_name_server_tools_it_does_not_offer() -> None:
    # Found by the fuzz: the chat request a completion runs as refused it (a 500 before).
    err = refused(COMPLETIONS, {"prompt": "hi", "ooo_spec": {"server_tools": ["lookup"]}})
    assert "offers no tools" in err.message
    accepted(COMPLETIONS, {"prompt": "hi", "ooo_spec": {"server_tools": True}})
