"""Request limits: what one chat completion may ask of the server, checked before any model work.

Each breach is an `ApiError` that names the limit and the value that broke it, so a client can
fix the request. Pure functions over the parsed body and the validated request, plus
`with_deadline`, which bounds a whole event stream (the main model's steps, tool rounds) by the
request's deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from typing import Any, TypeVar

from app.api.errors import ApiError
from app.api.json_body import loads_strict
from app.check_pool import CheckPool, stop_if_abandoned
from app.config import LimitsConfig
from app.cpu_budget import OverBudget, run_with_cpu_budget
from app.openai_models import ChatCompletionRequest
from app.speculation.schema_limits import expansion_size, pattern_problem, schema_patterns
from app.speculation.validation import check_schema

T = TypeVar("T")


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value: a scalar is 0, `[]`/`{}` 1, `[[1]]` 2.

    Iterative, so a hostile body cannot exhaust the recursion limit here."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_body_depth(data: Any, limits: LimitsConfig) -> None:
    """Before validation: pydantic and JSON Schema recurse over what they validate."""
    depth = json_depth(data)
    if depth > limits.max_json_depth:
        raise ApiError(
            400,
            f"the request body is nested {depth} levels deep; the limit is "
            f"{limits.max_json_depth}",
            code="body_too_deep",
        )


def check_request(request: ChatCompletionRequest, limits: LimitsConfig, context: int) -> None:
    """Counts and sizes of a validated request; `context` is the main model's context length.

    Runs before the tool schemas are compiled, so an oversized schema never reaches the
    validator. `app/api/request_checks.check_ask` runs the same parts one by one, each under
    the field it reads."""
    check_messages(request, limits)
    check_tools(request, limits)
    check_stop(request.stop, limits)
    check_arguments(request, limits)
    check_max_tokens(request, limits, context)


def check_messages(request: ChatCompletionRequest, limits: LimitsConfig) -> None:
    if len(request.messages) > limits.max_messages:
        raise ApiError(
            400,
            f"the request has {len(request.messages)} messages; the limit is "
            f"{limits.max_messages}",
            param="messages",
            code="too_many_messages",
        )


def check_tools(request: ChatCompletionRequest, limits: LimitsConfig) -> None:
    """The tools' count and each schema's size, depth, expansion and patterns: what bounds
    the work of validating them. Runs on schemas not yet known valid, so each part copes with
    any JSON where a keyword's value should be."""
    tools = request.tools or []
    if len(tools) > limits.max_tools:
        raise ApiError(
            400,
            f"the request has {len(tools)} tools; the limit is {limits.max_tools}",
            param="tools",
            code="too_many_tools",
        )
    total = 0
    for tool in tools:
        total += check_tool_schema(tool.function.name, tool.function.parameters, limits)
    if total > limits.max_total_schema_bytes:
        raise ApiError(
            400,
            f"the request's tool schemas take {total} bytes together; the limit is "
            f"{limits.max_total_schema_bytes}",
            param="tools",
            code="tool_schemas_too_large",
        )


def check_max_tokens(request: ChatCompletionRequest, limits: LimitsConfig, context: int) -> None:
    ceiling = min(limits.max_tokens, context)
    for field in ("max_tokens", "max_completion_tokens"):
        wanted: int | None = getattr(request, field)
        if wanted is not None and wanted > ceiling:
            raise ApiError(
                400,
                f"{field} is {wanted}; this server generates at most {ceiling} tokens per "
                "request",
                param=field,
                code="max_tokens_too_large",
            )


def check_stop(stop: str | list[str] | None, limits: LimitsConfig) -> None:
    """Each stop string is matched against the output after every step: bound both."""
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > limits.max_stop_strings:
        raise ApiError(
            400,
            f"stop has {len(strings)} strings; the limit is {limits.max_stop_strings}",
            param="stop",
            code="too_many_stop_strings",
        )
    for text in strings:
        if not text:  # vLLM's SamplingParams refuses it (in the engine call, a 5xx)
            raise ApiError(400, "stop strings must not be empty", param="stop",
                           code="empty_stop_string")
        if len(text) > limits.max_stop_chars:
            raise ApiError(
                400,
                f"a stop string is {len(text)} characters long; the limit is "
                f"{limits.max_stop_chars}",
                param="stop",
                code="stop_string_too_long",
            )


def check_arguments(request: ChatCompletionRequest, limits: LimitsConfig) -> None:
    """Tool call arguments in the conversation are parsed and validated: bound their length."""
    for index, message in enumerate(request.messages):
        for call in message.tool_calls or []:
            if len(call.function.arguments) > limits.max_argument_chars:
                raise ApiError(
                    400,
                    f"messages[{index}] has a tool call whose arguments are "
                    f"{len(call.function.arguments)} characters long; the limit is "
                    f"{limits.max_argument_chars}",
                    param="messages",
                    code="arguments_too_long",
                )


def check_tool_schema(name: str, schema: dict[str, Any], limits: LimitsConfig) -> int:
    """Size, depth, expansion and patterns of one tool's schema; returns its size in bytes.
    In the router's check pool, a check nobody waits for any more stops here
    (`stop_if_abandoned`), before its next schema or pattern."""
    stop_if_abandoned()
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limits.max_schema_bytes:
        raise ApiError(
            400,
            f"tool '{name}' has a parameters schema of {size} bytes; the limit is "
            f"{limits.max_schema_bytes}",
            param="tools",
            code="tool_schema_too_large",
        )
    depth = json_depth(schema)
    if depth > limits.max_schema_depth:
        raise ApiError(
            400,
            f"tool '{name}' has a parameters schema nested {depth} levels deep; the limit "
            f"is {limits.max_schema_depth}",
            param="tools",
            code="tool_schema_too_deep",
        )
    expanded = expansion_size(schema, limits.max_schema_expansion)
    if expanded > limits.max_schema_expansion:
        raise ApiError(
            400,
            f"tool '{name}' has a parameters schema that expands to more than "
            f"{limits.max_schema_expansion} subschemas (counting every $ref and every "
            "allOf/anyOf/oneOf branch it leads to)",
            param="tools",
            code="tool_schema_too_complex",
        )
    for pattern in schema_patterns(schema):
        stop_if_abandoned()  # each pattern compiles in RE2 (up to ~10 ms): stop between them
        problem = pattern_problem(pattern, limits.max_pattern_chars)
        if problem is not None:
            shown = pattern if len(pattern) <= 64 else pattern[:61] + "..."
            raise ApiError(
                400,
                f"tool '{name}' has a pattern {shown!r} that {problem}",
                param="tools",
                code="tool_schema_pattern",
            )
    return size


def body_too_large(size: int, max_bytes: int) -> ApiError:
    return ApiError(413, f"request body is {size} bytes; the limit is {max_bytes}",
                    code="body_too_large")


def json_object_body(body: bytes, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, or the 413/400 every route gives for it."""
    if len(body) > max_bytes:
        raise body_too_large(len(body), max_bytes)
    # Strict: long integers, NaN, duplicate keys and the like are 400s (app/api/json_body.py).
    data = loads_strict(body)
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    return data


def body_timeout(seconds: float) -> ApiError:
    return ApiError(408, f"the request body did not arrive within {seconds:g} s",
                    code="body_timeout")


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None,
                       max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The body from `chunks`, refused (413) from its declared `Content-Length` before any
    read, and while reading once it passes `max_bytes` (a chunked body declares nothing), so
    an oversized body is never held whole; a 408 `body_timeout` when the whole body has not
    arrived within `timeout_s` (a body sent slowly or never must not hold the caller's slot)."""
    if timeout_s is None:
        return await _read_limited(chunks, declared, max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_limited(chunks, declared, max_bytes)
    except TimeoutError:
        raise body_timeout(timeout_s) from None


async def _read_limited(chunks: AsyncIterator[bytes], declared: str | None,
                        max_bytes: int) -> bytes:
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if length > max_bytes:
            raise body_too_large(length, max_bytes)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"request body is over the limit of {max_bytes} bytes",
                           code="body_too_large")
        parts.append(chunk)
    return b"".join(parts)


async def off_loop(work: Callable[[], T], cpu_s: float, max_wait_s: float, what: str) -> T:
    """`work()` in a worker thread, so a slow schema never blocks the event loop; a 400 once it
    has spent `cpu_s` of CPU time or `max_wait_s` have passed (app/cpu_budget.py: CPU time, so
    a busy machine does not refuse an ordinary request; the thread finishes on its own, the
    request's caps bound how long)."""
    try:
        return await run_with_cpu_budget(work, cpu_s, max_wait_s)
    except OverBudget as over:
        raise ApiError(400, f"{what} took longer than {cpu_s:g} s of CPU time ({over}); "
                       "simplify the request", code="request_too_complex") from None


async def in_pool(pool: CheckPool, tenant: str, key: Hashable, work: Callable[[], T],
                  cpu_s: float, max_wait_s: float, what: str) -> T:
    """`off_loop` in `tenant`'s share of `pool` (app/check_pool.py), `work` shared by the
    tenant's requests that ask for the same `key` meanwhile: the same 400 past `cpu_s` of CPU
    time or `max_wait_s` of waiting, queued or running."""
    try:
        return await pool.run(tenant, key, work, cpu_s, max_wait_s)
    except OverBudget as over:
        raise ApiError(400, f"{what} took longer than {cpu_s:g} s of CPU time or "
                       f"{max_wait_s:g} s in all ({over}); simplify the request",
                       code="request_too_complex") from None


def deadline_error(seconds: float) -> ApiError:
    return ApiError(
        503,
        f"the request took longer than the server's deadline of {seconds:g} s",
        code="deadline_exceeded",
    )


async def with_deadline(events: AsyncIterator[T], seconds: float) -> AsyncGenerator[T, None]:
    """`events`, cut off `seconds` from now with `deadline_error`.

    Waiting for the next event is cancelled at the deadline, so the producer's own cleanup
    (aborting the engines' requests) runs at once; the producer is closed on every exit."""
    deadline = asyncio.get_running_loop().time() + seconds
    try:
        while True:
            bound = asyncio.timeout_at(deadline)
            try:
                async with bound:
                    item = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if bound.expired():
                    raise deadline_error(seconds) from None
                raise
            yield item
    finally:
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await closer()


def check_output_schema(schema: dict[str, Any], limits: LimitsConfig | None) -> None:
    """A `response_format` JSON schema: the tool-schema limits (when given), then a valid
    JSON Schema; a 400 naming `response_format` otherwise."""
    stop_if_abandoned()
    if limits is not None:
        check_tool_schema("response_format", schema, limits)
    problem = check_schema(schema)
    if problem:
        raise ApiError(400, f"response_format has a schema that is not a valid JSON "
                       f"Schema: {problem}", param="response_format")
