"""Request limits (app.api.limits) and how parse_request applies them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api.chat_service import parse_request
from app.api.errors import ApiError
from app.api.limits import check_request, json_depth, with_deadline
from app.api.openai_models import ChatCompletionRequest
from app.config import LimitsConfig

LIMITS = LimitsConfig(max_json_depth=16, max_messages=3, max_tools=2, max_schema_bytes=300,
                      max_schema_depth=6, max_tokens=100)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def body(**extra: Any) -> bytes:
    data: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], **extra}
    return json.dumps(data).encode()


def tool(name: str, parameters: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def nested(depth: int) -> dict[str, Any]:
    """A schema nested `depth` levels deep (json_depth)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((depth - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def rejects(raw: bytes, status: int, *needles: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_request(raw, 100_000, LIMITS, 2048)
    err = caught.value
    assert err.status == status, err.message
    for needle in needles:
        assert needle in err.message, err.message
    return err


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ("x", 0), ([], 1), ({}, 1), ([[1]], 2), ({"a": [1, {"b": None}]}, 3),
     ([[], [[[]]]], 4)],
)
def test_json_depth(value: Any, depth: int) -> None:
    assert json_depth(value) == depth


@given(st.recursive(st.none() | st.integers(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=2), inner, max_size=3)))
def test_json_depth_matches_a_recursive_definition(value: Any) -> None:
    def reference(v: Any) -> int:
        if isinstance(v, dict):
            return 1 + max((reference(c) for c in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((reference(c) for c in v), default=0)
        return 0

    assert json_depth(value) == reference(value)


def test_json_depth_survives_what_recursion_would_not() -> None:
    value: Any = 0
    for _ in range(50_000):
        value = [value]
    assert json_depth(value) == 50_000


def test_within_limits_passes() -> None:
    request = parse_request(body(tools=[tool("a"), tool("b")], max_tokens=100), 100_000,
                            LIMITS, 2048)
    assert len(request.tools or []) == 2


def test_too_many_tools_messages_and_tokens() -> None:
    assert rejects(body(tools=[tool("a"), tool("b"), tool("c")]), 400, "3 tools", "2"
                   ).code == "too_many_tools"
    many = [{"role": "user", "content": "x"}] * 4
    assert rejects(json.dumps({"messages": many}).encode(), 400, "4 messages").param == "messages"
    assert rejects(body(max_tokens=101), 400, "max_tokens is 101", "100").param == "max_tokens"
    assert rejects(body(max_completion_tokens=500), 400, "max_completion_tokens").code == (
        "max_tokens_too_large")


def test_max_tokens_is_bounded_by_the_context_too() -> None:
    request = ChatCompletionRequest.model_validate(json.loads(body(max_tokens=80)))
    check_request(request, LIMITS, 100)
    with pytest.raises(ApiError, match="at most 64"):
        check_request(request, LIMITS, 64)


def test_schema_size_and_depth_name_the_tool() -> None:
    big = {"type": "object", "description": "x" * 400, "properties": {}}
    err = rejects(body(tools=[tool("wide", big)]), 400, "tool 'wide'", "bytes")
    assert err.code == "tool_schema_too_large"
    err = rejects(body(tools=[tool("deep", nested(9))]), 400, "tool 'deep'", "nested")
    assert err.code == "tool_schema_too_deep"


def test_deep_schema_is_refused_before_it_is_compiled() -> None:
    # Parses, but deep enough that compiling it would exhaust Python's recursion limit.
    schema = nested(401)
    limits = LimitsConfig(max_json_depth=512, max_schema_depth=256)
    with pytest.raises(ApiError) as caught:
        parse_request(body(tools=[tool("deep", schema)]), 10_000_000, limits, 2048)
    assert caught.value.status == 400 and "nested" in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000, b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
     b'{"messages": [{"role": "user", "content": [' + b'{"a":' * 3000 + b"1" + b"}" * 3000
     + b"]}]}"],
    ids=["array", "messages", "content"],
)
def test_deeply_nested_bodies_are_a_400_not_a_crash(raw: bytes) -> None:
    rejects(raw, 400, "nested")
    # Without limits configured, the parser's own recursion guard still gives a 400.
    with pytest.raises(ApiError) as caught:
        parse_request(raw, 10_000_000)
    assert caught.value.status == 400


def test_body_size_is_a_413() -> None:
    with pytest.raises(ApiError) as caught:
        parse_request(b" " * 2000, 1024, LIMITS, 2048)
    assert caught.value.status == 413 and "1024" in caught.value.message


async def test_deadline_cuts_a_slow_stream_and_closes_it() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[int]:
        try:
            yield 1
            await asyncio.sleep(10)
            yield 2
        finally:
            closed.set()

    got: list[int] = []
    with pytest.raises(ApiError) as caught:
        async for item in with_deadline(slow(), 0.2):
            got.append(item)
    assert got == [1]
    assert caught.value.status == 503 and caught.value.code == "deadline_exceeded"
    assert "0.2 s" in caught.value.message
    assert closed.is_set()


async def test_deadline_passes_a_fast_stream_and_its_own_errors_through() -> None:
    async def fast() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    assert [i async for i in with_deadline(fast(), 5)] == [0, 1, 2]

    async def failing() -> AsyncIterator[int]:
        yield 0
        raise TimeoutError("the producer's own timeout")

    with pytest.raises(TimeoutError, match="own timeout"):
        async for _ in with_deadline(failing(), 5):
            pass


async def test_deadline_counts_from_the_start_not_per_item() -> None:
    async def steady() -> AsyncIterator[int]:
        for i in range(10):
            await asyncio.sleep(0.05)
            yield i

    got: list[int] = []
    with pytest.raises(ApiError):
        async for item in with_deadline(steady(), 0.22):
            got.append(item)
    assert 2 <= len(got) <= 5
