"""Request limits (app.api.limits) and how parse_request applies them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api.errors import ApiError
from app.api.limits import check_request, json_depth, with_deadline
from app.api.request_checks import parse_request
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest

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
            await asyncio.Event().wait()  # nothing sets it: only the deadline ends the wait
            yield 2
        finally:
            closed.set()

    got: list[int] = []

    async def drain() -> None:
        async for item in with_deadline(slow(), 0.2):
            got.append(item)

    with pytest.raises(ApiError) as caught:
        await asyncio.wait_for(drain(), 30)  # a bound on waiting: the deadline must fire
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
    """Every item of this endless stream comes at once, so no wait for one item comes near the
    deadline: only a deadline counted from the start ends it."""
    async def endless() -> AsyncIterator[int]:
        i = 0
        while True:
            await asyncio.sleep(0)  # the producer's turn of the loop; not a wait
            yield i
            i += 1

    async def drain() -> None:
        async for _ in with_deadline(endless(), 0.2):
            pass

    with pytest.raises(ApiError) as caught:
        await asyncio.wait_for(drain(), 30)  # a bound on waiting: the deadline must fire
    assert caught.value.code == "deadline_exceeded"


# ----- issue 20: caps on stop, arguments, total schema bytes, expansion, patterns, seed ------
WIDE = LimitsConfig(max_tools=8, max_schema_expansion=200, max_pattern_chars=40,
                    max_total_schema_bytes=600, max_argument_chars=100, max_stop_strings=2,
                    max_stop_chars=5)


def wide_rejects(raw: bytes, *needles: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_request(raw, 100_000, WIDE, 2048)
    for needle in needles:
        assert needle in caught.value.message or needle == caught.value.code, caught.value
    assert caught.value.status == 400
    return caught.value


def doubling(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}] * 2}
                            for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/l0"}}, "$defs": defs}


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"seed": 2**63}, "", "seed"),
    ({"seed": -(2**63) - 1}, "", "seed"),
    ({"stop": ["a", "b", "c"]}, "too_many_stop_strings", "stop"),
    ({"stop": "toolong"}, "stop_string_too_long", "stop"),
    ({"stop": ["a", ""]}, "empty_stop_string", "stop"),
    ({"tools": [tool("d", doubling(12))]}, "tool_schema_too_complex", "tools"),
    ({"tools": [tool("p", {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^(a+)+$"}}})]}, "tool_schema_pattern", "tools"),
    ({"tools": [tool("p", {"type": "object", "patternProperties": {"x" * 50: {}}})]},
     "tool_schema_pattern", "tools"),
    ({"tools": [tool(f"t{i}", SCHEMA) for i in range(8)]}, "tool_schemas_too_large", "tools"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": "{" + " " * 200 + "}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
     "arguments_too_long", "messages"),
])
def test_new_caps_are_400s_naming_the_field(extra: dict[str, Any], code: str,
                                            param: str) -> None:
    err = wide_rejects(body(**extra))
    assert err.param == param, err
    if code:
        assert err.code == code, err


def test_values_inside_the_caps_pass() -> None:
    request = parse_request(body(seed=-(2**63), stop=["ab", "c"], tools=[tool("d", doubling(3))]),
                            100_000, WIDE, 2048)
    assert request.seed == -(2**63)
    assert parse_request(body(seed=2**63 - 1), 100_000, WIDE, 2048).seed == 2**63 - 1


async def test_read_limited_refuses_by_content_length_and_while_reading() -> None:
    from app.api.limits import read_limited

    read: list[int] = []

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for i in range(n):
            read.append(i)
            yield b"x" * 100

    assert await read_limited(chunks(3), "300", 300) == b"x" * 300
    read.clear()
    with pytest.raises(ApiError) as caught:
        await read_limited(chunks(3), "301", 300)
    assert caught.value.status == 413 and read == []  # refused before reading anything
    with pytest.raises(ApiError) as caught:
        await read_limited(chunks(100), None, 250)  # chunked: no length declared
    assert caught.value.status == 413 and len(read) == 3  # stopped at the first chunk over
    with pytest.raises(ApiError) as caught:
        await read_limited(chunks(1), "ten", 250)
    assert caught.value.status == 400


async def test_off_loop_refuses_work_past_its_cpu_time_with_a_400_and_keeps_the_loop_free(
) -> None:
    import threading
    import time

    from app.api.limits import off_loop

    loop = asyncio.get_running_loop()
    began = asyncio.Event()
    release, ended = threading.Event(), threading.Event()

    def busy() -> None:
        loop.call_soon_threadsafe(began.set)
        # CPU, until released; the deadline only keeps a broken test from spinning for ever.
        give_up = time.monotonic() + 60
        while not release.wait(0) and time.monotonic() < give_up:
            pass
        ended.set()

    checking = asyncio.ensure_future(off_loop(busy, 0.3, 60, "checking"))
    try:
        # The loop hears from the work while it holds its thread (bounds: waiting only).
        await asyncio.wait_for(began.wait(), 30)
        with pytest.raises(ApiError) as caught:
            await asyncio.wait_for(checking, 30)
        assert not ended.is_set()  # refused while the work still ran
    finally:
        release.set()
    assert caught.value.status == 400 and caught.value.code == "request_too_complex"
    assert await off_loop(lambda: 7, 1, 60, "checking") == 7


async def test_off_loop_waits_out_a_thread_that_gets_no_cpu_up_to_the_wait_cap() -> None:
    import threading

    from app.api.limits import off_loop

    # A blocked thread stands in for one a loaded machine does not run: no CPU spent, so
    # no 400 at the CPU limit; the wait's cap still ends it.
    assert await off_loop(lambda: threading.Event().wait(0.5) or 7, 0.1, 60, "checking") == 7
    release = threading.Event()
    try:
        with pytest.raises(ApiError) as caught:
            # Blocked until the test is done: only the wait's cap can answer.
            await asyncio.wait_for(off_loop(lambda: release.wait(60), 0.1, 0.3, "checking"), 30)
    finally:
        release.set()
    assert caught.value.code == "request_too_complex"


def test_diagnostics_are_grouped_and_the_flat_keys_still_accepted() -> None:
    from pydantic import ValidationError

    from app.openai_models import OooSpecOptions

    flat = OooSpecOptions.model_validate({"realign": False, "await_prediction": True})
    nested = OooSpecOptions.model_validate({"diagnostics": {"realign": False,
                                                            "await_prediction": True}})
    assert flat == nested and flat.diagnostics.realign is False
    assert "realign" not in flat.model_dump()  # one place on the wire from here on
    both = OooSpecOptions.model_validate({"verify_prediction": False,
                                          "diagnostics": {"verify_prediction": True}})
    assert both.diagnostics.verify_prediction is True
    with pytest.raises(ValidationError):
        OooSpecOptions.model_validate({"diagnostics": {"nope": 1}})
