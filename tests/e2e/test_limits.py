"""Request limits over HTTP: each breach is a 4xx that says which limit, before any model work,
and the server keeps serving. The deadline is tested on a side router with a 3 s deadline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import LimitsConfig, RouterConfig
from tests.e2e.cluster import (
    GOOD,
    TOOL,
    chat,
    counters,
    delete_side_app,
    deploy_side_app,
    idle,
    wait_for,
)

pytestmark = pytest.mark.e2e

LIMITS = LimitsConfig()  # configs/local.yaml keeps the defaults
MAX_BODY = RouterConfig().max_body_bytes


def tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name,
                                             "parameters": parameters or TOOL["function"][
                                                 "parameters"]}}


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("too many tools", {**GOOD, "tools": [tool(f"t{i}") for i in range(LIMITS.max_tools + 1)],
                        "tool_choice": "auto"}, "too_many_tools", f"{LIMITS.max_tools + 1} tools"),
    ("schema too deep", {**GOOD, "tools": [tool("deep_one", deep_schema(20))],
                         "tool_choice": "auto"}, "tool_schema_too_deep", "tool 'deep_one'"),
    ("schema too large", {**GOOD, "tools": [tool("huge_one", {
        "type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200}
                                         for i in range(400)}})], "tool_choice": "auto"},
     "tool_schema_too_large", "tool 'huge_one'"),
    ("max_tokens too large", {**GOOD, "max_tokens": 100_000}, "max_tokens_too_large",
     "max_tokens is 100000"),
    ("too many messages", {**GOOD, "messages": [{"role": "user", "content": "x"}] * (
        LIMITS.max_messages + 1)}, "too_many_messages", "messages"),
    ("invalid schema", {**GOOD, "tools": [tool("broken_one", {"type": "objekt"})],
                        "tool_choice": "auto"}, "", "tool 'broken_one'"),
]


@pytest.mark.parametrize("name,body,code,needle", CASES, ids=[c[0] for c in CASES])
def test_limit_breach_is_a_clear_400(app_url: str, name: str, body: dict[str, Any], code: str,
                                     needle: str) -> None:
    for stream in (False, True):
        r = chat(app_url, {**body, "stream": stream}, timeout=60)
        assert r.status_code == 400, (stream, r.text)
        error = r.json()["error"]
        assert needle in error["message"], error
        if code:
            assert error["code"] == code


def test_body_too_large_is_413_and_deep_json_is_400(app_url: str) -> None:
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    r = chat(app_url, big, timeout=60)
    assert r.status_code == 413 and str(MAX_BODY) in r.json()["error"]["message"]
    for raw in (b"[" * 200_000, b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}"):
        r = httpx.post(f"{app_url}/v1/chat/completions", content=raw, timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "nested" in r.json()["error"]["message"]
    assert chat(app_url, GOOD).status_code == 200


def test_streaming_request_longer_than_the_context_is_a_400_not_an_inband_error(
    app_url: str,
) -> None:
    long = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 8,
            "stream": True}
    r = chat(app_url, long, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "context" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def short_deadline_url(app_url: str) -> Iterator[str]:
    url = deploy_side_app("side-deadline", app_url, {"router": {"request_timeout_s": 3}})
    try:
        yield url
    finally:
        delete_side_app("side-deadline")


@pytest.mark.parametrize("stream", [False, True], ids=["plain-response", "stream"])
def test_deadline_is_a_503_and_stops_the_engines(app_url: str, short_deadline_url: str,
                                                 stream: bool) -> None:
    before = counters("MainModel")["aborted"]
    body = {"messages": [{"role": "user", "content": "Tell a very long story."}],
            "temperature": 0, "max_tokens": 1500, "stream": stream}
    r = chat(short_deadline_url, body, timeout=120)
    if stream:
        # Headers went out with the first token; the deadline arrives in-band, then [DONE].
        assert r.status_code == 200
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
    else:
        assert r.status_code == 503, r.text
        error = r.json()["error"]
    assert "deadline of 3 s" in error["message"], error
    assert error["code"] == "deadline_exceeded"
    after = wait_for("main idle", lambda: (c if idle(c := counters("MainModel")) else None), 30)
    assert after["aborted"] > before
    # The engines keep serving. Asked through the session app (same engines, the default
    # deadline): a forced call within 3 s would be a wall-clock limit on a loaded machine.
    r = chat(app_url, GOOD)
    assert r.status_code == 200, r.text


UNCOMPILABLE = [
    {"type": "integer", "minimum": 10, "maximum": 1},
    {"type": "string", "minLength": 5, "maxLength": 1},
]


def test_an_unknown_string_format_is_never_a_5xx(app_url: str) -> None:
    """An unknown `format` (an annotation in JSON Schema): the JSON fallback's grammar refused
    it (a 400 rejected_by_engine); a forced call through the format's structural tag may
    compile it. Either way the client hears a clear answer, not a 5xx, and the app serves on."""
    prop = {"type": "string", "format": "no-such-format"}
    body = {**GOOD, "tools": [tool("odd_one", {"type": "object", "properties": {"a": prop},
                                               "required": ["a"]})]}
    r = chat(app_url, body, timeout=120)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"message", "code"}
    assert chat(app_url, GOOD).status_code == 200


@pytest.mark.parametrize("prop", UNCOMPILABLE, ids=["min>max", "minLength>maxLength"])
def test_schema_the_engine_cannot_compile_is_a_400(app_url: str, prop: dict[str, Any]) -> None:
    """Valid JSON Schema that vLLM cannot turn into a grammar for a forced call: the client's
    request is at fault (found by test_fuzz), so a 400, not 'main model unavailable'."""
    body = {**GOOD, "tools": [tool("odd_one", {"type": "object", "properties": {"a": prop},
                                               "required": ["a"]})]}
    r = chat(app_url, body, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "rejected_by_engine"
    assert chat(app_url, GOOD).status_code == 200
