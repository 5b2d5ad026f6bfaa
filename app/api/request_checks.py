"""A chat request's checks before any model work: the body to a validated
`ChatCompletionRequest`, or an `ApiError` (4xx) saying what is wrong."""

from __future__ import annotations

from app.api.errors import ApiError, validated
from app.api.limits import (
    check_body_depth,
    check_output_schema,
    check_request,
    json_object_body,
)
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest
from app.speculation.validation import check_schema


def parse_request(
    body: bytes,
    max_bytes: int,
    limits: LimitsConfig | None = None,
    context: int | None = None,
) -> ChatCompletionRequest:
    """The validated request, or an `ApiError`; `limits` (app.api.limits) and the main model's
    `context` length bound what it may ask for."""
    data = json_object_body(body, max_bytes)
    if limits is not None:
        check_body_depth(data, limits)
    request = validated(ChatCompletionRequest, data)
    if limits is not None:
        check_request(request, limits, context if context is not None else limits.max_tokens)
    if limits is not None and (request.n or 1) > limits.max_choices:
        raise ApiError(400, f"n is {request.n}; this server returns at most "
                       f"{limits.max_choices} choices per request", param="n",
                       code="too_many_choices")
    schema = request.output_schema
    if schema is not None:
        check_output_schema(schema, limits)
    for tool in request.tools or []:
        problem = check_schema(tool.function.parameters)
        if problem:
            raise ApiError(
                400,
                f"tool '{tool.function.name}' has parameters that are not a valid JSON "
                f"Schema: {problem}",
                param="tools",
            )
    return request
