"""Router-side logic of one chat completion, independent of Ray.

The deployment supplies two callables: `start_sidecar(payload)` (returns an opaque token the
main call carries, or None) and `main_events(payload, token)` (the main model's event stream).
Everything else — request checks, the OpenAI response and SSE shapes, the `ooo_spec` report —
lives here so it is testable without a model.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from app.api.errors import ApiError, describe_validation_errors
from app.api.openai_models import ChatCompletionRequest, OooSpecReport
from app.engine.tool_format import new_call_id
from app.spec.reconcile import classify_outcome
from app.spec.validation import check_schema

StartSidecar = Callable[[dict[str, Any]], Awaitable[Any]]
MainEvents = Callable[[dict[str, Any], Any], AsyncIterator[dict[str, Any]]]


def parse_request(body: bytes, max_bytes: int) -> ChatCompletionRequest:
    if len(body) > max_bytes:
        raise ApiError(413, f"request body is {len(body)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        message, param = describe_validation_errors(exc.errors())
        raise ApiError(400, message, param=param) from None
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


class ChatService:
    def __init__(self, model_name: str, sidecar_enabled: bool) -> None:
        self.model_name = model_name
        self.sidecar_enabled = sidecar_enabled

    def wants_sidecar(self, request: ChatCompletionRequest) -> bool:
        return (
            self.sidecar_enabled
            and request.ooo_spec.enabled
            and request.effective_tool_choice != "none"
        )

    async def events(
        self,
        request: ChatCompletionRequest,
        start_sidecar: StartSidecar,
        main_events: MainEvents,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """('delta', {'text'}) per main-model step, then ('final', completion dict).

        The sidecar is started first and the main call right after, without waiting for the
        sidecar's answer: the main model starts decoding at once."""
        started = time.perf_counter()
        payload = request.model_dump(exclude_none=True)
        token = await start_sidecar(payload) if self.wants_sidecar(request) else None
        final: dict[str, Any] | None = None
        async for event in main_events(payload, token):
            kind = event.get("type")
            if kind == "error":
                raise ApiError(event["status"], event["message"], event.get("param"),
                               event.get("code"))
            if kind == "delta":
                yield "delta", event
            elif kind == "final":
                final = event
        if final is None:
            raise ApiError(503, "the main model ended the request without a result")
        yield "final", self.completion(request, final, started)

    def completion(
        self, request: ChatCompletionRequest, final: dict[str, Any], started: float
    ) -> dict[str, Any]:
        calls = final["calls"]
        tool_calls = [
            {
                "id": new_call_id(),
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": json.dumps(c["arguments"], ensure_ascii=False),
                },
            }
            for c in calls
        ]
        message: dict[str, Any] = {"role": "assistant", "content": final["content"]}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = final["finish_reason"] or "stop"
        if tool_calls and finish == "stop":
            finish = "tool_calls"
        report = self.report(request, final, started)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": {
                "prompt_tokens": final["prompt_tokens"],
                "completion_tokens": final["completion_tokens"],
                "total_tokens": final["prompt_tokens"] + final["completion_tokens"],
            },
            "ooo_spec": report.model_dump(),
        }

    def report(
        self, request: ChatCompletionRequest, final: dict[str, Any], started: float
    ) -> OooSpecReport:
        sidecar = final.get("sidecar") or {}
        speculated = self.wants_sidecar(request)
        schemas = {t.function.name: t.function.parameters for t in request.tools or []}
        outcome = classify_outcome(
            speculated=speculated,
            sidecar_status=sidecar.get("status", "none"),
            sidecar_no_call=bool(sidecar.get("no_call")),
            candidates=final.get("candidates") or [],
            committed=final["calls"],
            schemas=schemas,
        )
        return OooSpecReport.model_validate(
            {
                "enabled": speculated,
                "outcome": outcome,
                "candidates": final.get("candidates") or [],
                "main": final["main"],
                "tool_results": [],
                "timings_ms": {
                    "total": (time.perf_counter() - started) * 1000,
                    "sidecar": sidecar.get("elapsed_ms", 0.0),
                    "main": final.get("main_ms", 0.0),
                    "tools": 0.0,
                },
            }
        )


def sse(data: dict[str, Any] | str) -> str:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {body}\n\n"


def chunk(
    completion_id: str, model: str, created: int, delta: dict[str, Any],
    finish_reason: str | None = None,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                     "logprobs": None}],
    }


async def stream_sse(
    request: ChatCompletionRequest,
    events: AsyncIterator[tuple[str, dict[str, Any]]],
    model: str,
) -> AsyncIterator[str]:
    """OpenAI SSE: role chunk, content deltas (or the tool calls once parsed), a finish chunk,
    a usage chunk when asked, the `ooo_spec` object on the last chunk, then `[DONE]`.

    With tools in play the text is held back until the end: the client must see either
    content or parsed tool calls, never raw `<tool_call>` markup."""
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    hold_text = request.effective_tool_choice != "none"
    yield sse(chunk(completion_id, model, created, {"role": "assistant", "content": ""}))
    try:
        async for kind, event in events:
            if kind == "delta":
                if not hold_text:
                    yield sse(chunk(completion_id, model, created, {"content": event["text"]}))
                continue
            choice = event["choices"][0]
            message = choice["message"]
            if hold_text and message.get("content"):
                yield sse(chunk(completion_id, model, created, {"content": message["content"]}))
            for index, call in enumerate(message.get("tool_calls") or []):
                delta = {"tool_calls": [{"index": index, **call}]}
                yield sse(chunk(completion_id, model, created, delta))
            last = chunk(completion_id, model, created, {}, choice["finish_reason"])
            include_usage = request.stream_options and request.stream_options.include_usage
            if include_usage:
                yield sse(last)
                last = {**chunk(completion_id, model, created, {}), "choices": [],
                        "usage": event["usage"]}
            last["ooo_spec"] = event["ooo_spec"]
            yield sse(last)
    except ApiError as err:
        yield sse(err.body())
    except Exception as exc:  # the stream has started: report in-band, then close cleanly
        yield sse({"error": {"message": f"generation failed: {exc}", "type": "server_error",
                             "param": None, "code": None}})
    yield sse("[DONE]")
