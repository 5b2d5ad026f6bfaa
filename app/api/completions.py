"""`POST /v1/completions`: a prompt in, text out (streaming or not), as vLLM's server does.

The request becomes a chat request without tools (what the main model service takes) plus the
raw prompt, which the main replica tokenizes instead of applying the chat template. No sidecar
runs: there is no call to predict. With `ooo_spec.enabled` the main model still drafts from the
prompt (prompt lookup), verified like every draft, so the text is plain decoding's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic import Field, model_validator

from app.api.chat_service import sse
from app.api.errors import ApiError, api_error
from app.api.limits import with_deadline
from app.openai_models import (
    SEED_MAX,
    SEED_MIN,
    ChatCompletionRequest,
    MainReport,
    OooSpecOptions,
    OooSpecReport,
    SamplingFields,
    StreamOptions,
    TimingsReport,
)
from app.output_format import ResponseFormat
from app.speculation.turn import TurnDelta, TurnError, TurnEvent, TurnResult

Prompt = str | list[int]
# One choice's main-model events: the deployment's `generate` with a raw prompt.
# Raises `TurnError` when the request cannot be served as asked.
MainEvents = Callable[[dict[str, Any], Prompt], AsyncIterator[TurnEvent]]

logger = logging.getLogger(__name__)


class CompletionRequest(SamplingFields):
    """As vLLM's, with its sampling extras (`SamplingFields`); extra keys are a 400."""

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # vLLM's (and OpenAI's) default here
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # as chat's (app.openai_models)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    ooo_spec: OooSpecOptions = Field(default_factory=OooSpecOptions)

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("'echo' is not supported")
        if self.reasoning_effort is not None:
            raise ValueError("'reasoning_effort' is a chat field: a completion has no chat "
                             "template to switch thinking in")
        if self.suffix:
            raise ValueError("'suffix' is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        if not self.prompts():
            raise ValueError("'prompt' must not be empty")
        if isinstance(self.ooo_spec.server_tools, list) and self.ooo_spec.server_tools:
            raise ValueError(f"ooo_spec.server_tools names {self.ooo_spec.server_tools}, but a "
                             "completion offers no tools")
        if self.response_format is not None:
            self.response_format.output_schema()  # ValueError: json_schema missing
        return self

    def prompts(self) -> list[Prompt]:
        """Each prompt of the request (a string, or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [[p for p in prompt if isinstance(p, int)]]
        return [p for p in prompt if isinstance(p, str | list)]

    def chat_request(self, index: int) -> ChatCompletionRequest:
        """What the main model service takes for choice `index` of a prompt (no tools; the
        raw prompt travels beside it). As vLLM's parallel sampling: with a seed, choice i
        samples with `seed + i`."""
        return ChatCompletionRequest(
            messages=[{"role": "user", "content": ""}],  # type: ignore[list-item]
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=None if self.seed is None else self.seed + index,
            stop=self.stop,
            logprobs=self.logprobs is not None or None,
            top_logprobs=self.logprobs,
            response_format=self.response_format,
            **self.sampling_field_values(),
            # Past calls are a chat thing: a completion neither uses nor records them.
            ooo_spec=self.ooo_spec.model_copy(update={"history": False}),
        )


def _report(request: CompletionRequest, finals: Sequence[TurnResult], started: float
            ) -> dict[str, Any]:
    """The `ooo_spec` object: no sidecar (nothing to predict); the main model's counts over
    every choice."""
    main = MainReport(
        steps=sum(f.main.steps for f in finals),
        completion_tokens=sum(f.main.completion_tokens for f in finals),
        drafted_tokens=sum(f.main.drafted_tokens for f in finals),
        accepted_tokens=sum(f.main.accepted_tokens for f in finals),
        ttft_ms=min((f.main.ttft_ms for f in finals), default=0.0),
        decode_ms=max((f.main.decode_ms for f in finals), default=0.0),
        cached_tokens=sum(f.main.cached_tokens for f in finals),
    )
    total = (time.perf_counter() - started) * 1000
    return OooSpecReport(
        enabled=request.ooo_spec.enabled,
        outcome="no_call" if request.ooo_spec.enabled else "disabled",
        main=main,
        timings_ms=TimingsReport(total=total, main=total),
        no_drafts_reason=request.draft_free_reason() if request.ooo_spec.enabled else None,
    ).model_dump()


def _usage(finals: Sequence[TurnResult], prompts: int, n: int) -> dict[str, Any]:
    # As vLLM: each prompt counted once, every choice's completion.
    prompt_tokens = sum(finals[i * n].prompt_tokens for i in range(prompts))
    cached_tokens = sum(finals[i * n].main.cached_tokens for i in range(prompts))
    completion_tokens = sum(f.completion_tokens for f in finals)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _finish(final: TurnResult) -> str:
    return final.finish_reason or "stop"


class CompletionService:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def _streams(
        self, request: CompletionRequest, main_events: MainEvents
    ) -> list[AsyncIterator[TurnEvent]]:
        """One main-model event stream per choice, prompt-major (index = prompt * n + i)."""
        return [
            main_events(request.chat_request(i).model_dump(exclude_none=True), prompt)
            for prompt in request.prompts() for i in range(request.n)
        ]

    async def complete(
        self, request: CompletionRequest, main_events: MainEvents
    ) -> dict[str, Any]:
        started = time.perf_counter()
        streams = self._streams(request, main_events)
        try:
            async with asyncio.TaskGroup() as group:  # choices in parallel; one fails: all stop
                tasks = [group.create_task(_final(s)) for s in streams]
        except BaseExceptionGroup as grouped:
            raise grouped.exceptions[0] from None
        finals = [task.result() for task in tasks]
        choices = [
            {"index": i, "text": f.content or "", "logprobs": f.logprobs,
             "finish_reason": _finish(f), "stop_reason": None}
            for i, f in enumerate(finals)
        ]
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(finals, len(request.prompts()), request.n),
            "ooo_spec": _report(request, finals, started),
        }

    async def stream(
        self, request: CompletionRequest, main_events: MainEvents, timeout_s: float
    ) -> AsyncIterator[str]:
        """SSE: text chunks per choice as they come (choices one after the other), a finish
        chunk per choice, a usage chunk when asked, `ooo_spec` on the last chunk, `[DONE]`.
        An error before the first text is raised (the route answers it with its status);
        after it, it is reported in-band."""
        started = time.perf_counter()
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        total = len(request.prompts()) * request.n

        def body(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {"id": completion_id, "object": "text_completion", "created": created,
                    "model": self.model_name, "choices": choices}

        async def tagged() -> AsyncIterator[tuple[int, TurnEvent]]:
            for index, events in enumerate(self._streams(request, main_events)):
                try:
                    async for event in events:
                        yield index, event
                except TurnError as err:
                    raise api_error(err) from None

        finals: list[TurnResult] = []
        sent = False
        try:
            last: dict[str, Any] = {}
            async for index, event in with_deadline(tagged(), timeout_s):
                if isinstance(event, TurnDelta):
                    sent = True
                    yield sse(body([{"index": index, "text": event.text,
                                     "logprobs": event.logprobs,
                                     "finish_reason": None, "stop_reason": None}]))
                else:
                    finals.append(event)
                    last = body([{"index": index, "text": "", "logprobs": None,
                                  "finish_reason": _finish(event), "stop_reason": None}])
                    if index < total - 1:
                        sent = True
                        yield sse(last)
            usage = _usage(finals, len(request.prompts()), request.n)
            if request.stream_options and request.stream_options.include_usage:
                yield sse(last)
                last = {**body([]), "usage": usage}
            last["ooo_spec"] = _report(request, finals, started)
            yield sse(last)
        except ApiError as err:
            if not sent:
                raise
            yield sse(err.body())
        except Exception:  # the stream has started: report in-band, then close
            if not sent:
                raise
            # The details go to the log only: an exception's text can carry internals.
            logger.exception("completion stream failed")
            yield sse({"error": {"message": "generation failed",
                                 "type": "server_error", "param": None, "code": None}})
        yield sse("[DONE]")


async def _final(events: AsyncIterator[TurnEvent]) -> TurnResult:
    final: TurnResult | None = None
    try:
        async for event in events:
            if isinstance(event, TurnResult):
                final = event
    except TurnError as err:
        raise api_error(err) from None
    if final is None:
        raise ApiError(503, "the main model ended the request without a result")
    return final
