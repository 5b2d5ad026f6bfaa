"""Bad requests get a 4xx OpenAI error envelope, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
GOOD = {"messages": [{"role": "user", "content": "Look up 'alpha'."}], "tools": [TOOL],
        "tool_choice": "required", "temperature": 0, "max_tokens": 32}

BAD: list[tuple[str, bytes | dict, int, str]] = [
    ("invalid json", b'{"messages": [', 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "JSON object"),
    ("missing messages", {"model": "x"}, 400, "messages"),
    ("wrong types", {"messages": "hello", "temperature": "hot"}, 400, "messages"),
    ("n=99", {**GOOD, "n": 99}, 400, "at most 8 choices"),
    ("unknown tool_choice function",
     {**GOOD, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "nope"),
    ("required without tools", {"messages": GOOD["messages"], "tool_choice": "required"}, 400,
     "required"),
    ("bad tool schema", {**GOOD, "tools": [{"type": "function", "function": {
        "name": "broken", "parameters": {"type": "objekt"}}}]}, 400, "broken"),
    ("unknown field", {**GOOD, "frobnicate": True}, 400, "frobnicate"),
    ("unknown model", {**GOOD, "model": "gpt-17"}, 404, "gpt-17"),
    ("negative max_tokens", {**GOOD, "max_tokens": -1}, 400, "max_tokens"),
]


@pytest.mark.parametrize("name,body,status,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_request_then_good_request(
    app_url: str, name: str, body: bytes | dict, status: int, needle: str
) -> None:
    url = f"{app_url}/v1/chat/completions"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"},
                       timeout=60)
    else:
        r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle.lower() in error["message"].lower(), error
    good = httpx.post(url, json=GOOD, timeout=120)
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["message"]["tool_calls"]


def test_context_overflow_is_a_clear_400(app_url: str) -> None:
    long = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 8}
    r = httpx.post(f"{app_url}/v1/chat/completions", json=long, timeout=60)
    assert r.status_code == 400
    assert "context" in r.json()["error"]["message"]


def test_unknown_route_is_404_envelope(app_url: str) -> None:
    r = httpx.get(f"{app_url}/v1/nothing-here")
    assert r.status_code == 404
    assert "error" in r.json()
