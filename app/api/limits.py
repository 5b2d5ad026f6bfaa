"""Request limits: what one chat completion may ask of the server, checked before any model work.

Each breach is an `ApiError` that names the limit and the value that broke it, so a client can
fix the request. Pure functions over the parsed body and the validated request, plus
`with_deadline`, which bounds a whole event stream (the main model's steps, tool rounds) by the
request's deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from app.api.errors import ApiError
from app.api.openai_models import ChatCompletionRequest
from app.config import LimitsConfig

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
    validator."""
    if len(request.messages) > limits.max_messages:
        raise ApiError(
            400,
            f"the request has {len(request.messages)} messages; the limit is "
            f"{limits.max_messages}",
            param="messages",
            code="too_many_messages",
        )
    tools = request.tools or []
    if len(tools) > limits.max_tools:
        raise ApiError(
            400,
            f"the request has {len(tools)} tools; the limit is {limits.max_tools}",
            param="tools",
            code="too_many_tools",
        )
    for tool in tools:
        check_tool_schema(tool.function.name, tool.function.parameters, limits)
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


def check_tool_schema(name: str, schema: dict[str, Any], limits: LimitsConfig) -> None:
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
