"""Issue 20 on real deployments: tenants kept apart, and work bounded before it starts.

Two API keys on a side app (tests/e2e/cluster.py) bound to the session app's engines: what key
A's call committed is never in key B's response for a near-identical question, while A's own
repeat gets its history candidate. Then each request that would have taken a replica down or
frozen a loop is a 400, and the app serves the next request normally; and a schema that refers
to a URL (a local listener's) is a 400 on every route while the listener sees no request."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import RouterConfig
from tests.e2e.cluster import GOOD, chat, delete_side_app, deploy_side_app
from tests.http_listener import RecordingListener

pytestmark = pytest.mark.e2e

KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-9876543210"
SIDE = "side-tenants"
MAX_BODY = RouterConfig().max_body_bytes
PASSPORT = "X1234567"
FLIGHT = {"type": "function", "function": {
    "name": "book_flight", "description": "Book a flight for a traveller.",
    "parameters": {"type": "object", "properties": {
        "traveller": {"type": "string"}, "passport": {"type": "string"},
        "city": {"type": "string"}, "date": {"type": "string"}},
        "required": ["traveller", "passport", "city", "date"]}}}


def booking(question: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], "tools": [FLIGHT],
            "tool_choice": "required", "temperature": 0, "max_tokens": 160}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def tenants_url(app_url: str) -> Iterator[str]:
    overrides = {"auth": {"api_keys": [{"key": KEY_A, "name": "a"},
                                       {"key": KEY_B, "name": "b"}]}}
    url = deploy_side_app(SIDE, app_url, overrides)
    try:
        yield url
    finally:
        delete_side_app(SIDE)


def test_one_keys_call_never_reaches_another_key(tenants_url: str) -> None:
    question = f"Book a flight for John Smith, passport {PASSPORT}, to Paris on 12 May"
    first = chat(tenants_url, booking(question), headers=bearer(KEY_A))
    assert first.status_code == 200, first.text
    [call] = first.json()["choices"][0]["message"]["tool_calls"]
    committed = json.loads(call["function"]["arguments"])
    secret = committed["passport"]
    assert "1234" in secret, committed  # A's call holds what only A's question says
    # B asks nearly the same (word overlap 0.69: over the history's similarity threshold).
    other = chat(tenants_url, booking("book a flight for to paris on may"),
                 headers=bearer(KEY_B))
    assert other.status_code == 200, other.text
    assert secret not in other.text and PASSPORT not in other.text  # nowhere in B's answer
    report = other.json()["ooo_spec"]
    assert not [c for c in report["candidates"] if c["source"] == "history"], report
    # B again with history off: the same call, so B's answer owes nothing to A's call.
    plain_b = chat(tenants_url, {**booking("book a flight for to paris on may"),
                                 "ooo_spec": {"history": False}}, headers=bearer(KEY_B))
    assert plain_b.status_code == 200
    assert (plain_b.json()["choices"][0]["message"]["tool_calls"][0]["function"]
            == other.json()["choices"][0]["message"]["tool_calls"][0]["function"])
    # A's own repeat still gets its history candidate: its own committed arguments.
    again = chat(tenants_url, booking(question), headers=bearer(KEY_A))
    assert again.status_code == 200
    history = [c for c in again.json()["ooo_spec"]["candidates"] if c["source"] == "history"]
    assert history and history[0]["valid"] and history[0]["arguments"] == committed, history


def doubling_schema(levels: int = 30) -> dict[str, Any]:
    """About 1.1 KB: level n's allOf lists level n+1's $ref twice (2**30 expansions)."""
    defs: dict[str, Any] = {f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2}
                            for i in range(levels)}
    defs[f"a{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs}


def with_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {**GOOD, "tools": [{"type": "function", "function": {"name": "lookup",
                                                                "parameters": parameters}}]}


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("seed", {**GOOD, "seed": 2**64}, "seed", ""),
    ("doubling-schema", with_tool(doubling_schema()), "tools", "tool_schema_too_complex"),
    ("catastrophic-pattern", with_tool({"type": "object", "properties": {
        "key": {"type": "string", "pattern": "^(a+)+$"}}, "required": ["key"]}),
     "tools", "tool_schema_pattern"),
    ("stop-strings", {**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "stop",
     "too_many_stop_strings"),
]


@pytest.mark.parametrize(("name", "body", "param", "code"), BAD, ids=[b[0] for b in BAD])
def test_unbounded_work_is_a_400_and_the_app_serves_on(app_url: str, name: str,
                                                       body: dict[str, Any], param: str,
                                                       code: str) -> None:
    r = chat(app_url, body, timeout=60)
    assert r.status_code == 400, r.text  # the request checks' code: refused before any work
    error = r.json()["error"]
    assert error["param"] == param, error
    if code:
        assert error["code"] == code, error
    assert len(json.dumps(body)) < 4000  # small requests, all of them
    ok = chat(app_url, GOOD)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["tool_calls"]


def test_a_chunked_body_over_the_limit_is_refused_while_reading(app_url: str) -> None:
    sent = 0

    def body() -> Iterator[bytes]:  # no Content-Length: httpx sends it chunked
        nonlocal sent
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(4 * MAX_BODY // 65_536):
            sent += 65_536
            yield b"x" * 65_536
        yield b'"}]}'

    try:
        r = httpx.post(f"{app_url}/v1/chat/completions", content=body(), timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "body_too_large"
    except httpx.RemoteProtocolError:
        pass  # the server may answer and close before the client finished sending
    ok = chat(app_url, GOOD)
    assert ok.status_code == 200


SLOW_GRAMMAR = with_tool({"type": "object", "properties": {
    f"p{i}": {"type": "string", "pattern": r"([a-z]{1,9}\.){1,100}"} for i in range(12)},
    "required": [f"p{i}" for i in range(12)]})


def test_a_slow_grammar_is_a_400_and_does_not_stall_other_requests(app_url: str) -> None:
    """About 25 s of grammar compile on this vocabulary: refused once it has spent the limit's
    CPU time (tests/unit/test_cpu_budget.py), while a good request sent at the same moment is
    answered before that refusal (an order of events, not a time: a loaded machine slows both)."""
    assert chat(app_url, GOOD).status_code == 200  # its grammar is compiled: only decoding left
    results: dict[str, tuple[int, str]] = {}
    order: list[str] = []

    def send(name: str, body: dict[str, Any]) -> None:
        r = chat(app_url, body, timeout=300)
        results[name] = (r.status_code, r.text)
        order.append(name)

    threads = [threading.Thread(target=send, args=("slow", SLOW_GRAMMAR)),
               threading.Thread(target=send, args=("good", GOOD))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, text = results["slow"]
    assert status == 400 and json.loads(text)["error"]["code"] == "grammar_too_slow", text
    assert "CPU time" in text
    status, text = results["good"]
    assert status == 200, text
    assert order == ["good", "slow"], order


@pytest.fixture(scope="module")
def listener() -> Iterator[RecordingListener]:
    server = RecordingListener()
    try:
        yield server
    finally:
        server.close()


def remote_references(url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (the keyword the 400 names, tool parameters referring to `url`)."""
    key = {"type": "string"}
    return {
        # The reference first: a validator would resolve it before trying the string branch.
        "dynamicRef": ("$dynamicRef", {"type": "object", "properties": {"key": {
            "anyOf": [{"$dynamicRef": f"{url}/dynamic"}, key]}}, "required": ["key"]}),
        "ref": ("$ref", {"type": "object", "properties": {"key": {"$ref": f"{url}/ref"}},
                         "required": ["key"]}),
        "dependencies-ref": ("$ref", {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"key": key}, "required": ["key"],
            "dependencies": {"key": {"$ref": f"{url}/dependencies"}}}),
    }


@pytest.mark.parametrize("name", list(remote_references("http://x")))
def test_a_schema_reference_to_a_url_is_a_400_and_never_fetched(
    app_url: str, listener: RecordingListener, name: str
) -> None:
    """Issue 29: tools (and `response_format`) whose schema refers to an `http://` URL, on
    chat and completions. Each is refused naming the keyword, the listener the URL points at
    sees no request, and the app serves the next request normally."""
    keyword, parameters = remote_references(listener.url)[name]
    as_tool = chat(app_url, with_tool(parameters), timeout=60)
    assert as_tool.status_code == 400, as_tool.text
    error = as_tool.json()["error"]
    assert error["param"] == "tools" and keyword in error["message"], error
    assert "not a local reference" in error["message"], error
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "answer", "schema": parameters}}
    as_output = chat(app_url, {"messages": GOOD["messages"], "response_format": response_format,
                               "max_tokens": 16}, timeout=60)
    assert as_output.status_code == 400, as_output.text
    assert as_output.json()["error"]["param"] == "response_format", as_output.text
    completion = httpx.post(f"{app_url}/v1/completions", timeout=60, json={
        "prompt": "Answer in JSON:", "max_tokens": 16, "response_format": response_format})
    assert completion.status_code == 400, completion.text
    assert completion.json()["error"]["param"] == "response_format", completion.text
    ok = chat(app_url, GOOD)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["tool_calls"]
    assert listener.hits == []
