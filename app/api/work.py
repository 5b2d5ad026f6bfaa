"""The engine work one request asks for, counted before any of it starts.

One HTTP request can start many engine requests: a main-model request per choice (`n`, or
prompts x `n` on /v1/completions) and, beside each, the sidecar's prediction, which in slots
mode fills every argument slot of the forced tool at once (one engine request per slot). The
per-key concurrency limit counts these (`Work.engine_requests`), and two limits bound the
tokens a request may make the engine generate (`limits.max_request_tokens`) and the logprob
entries the router builds from them (`limits.max_logprob_entries`).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.api.errors import ApiError
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest
from app.sidecar.slot_filling import slots


@dataclass(frozen=True)
class WorkPlan:
    """How the deployed sidecar works: in slots mode (`sidecar.mode`) a forced call's
    prediction runs one engine request per argument slot, up to `max_slots` (past it, none);
    otherwise one engine request per prediction."""

    slots_mode: bool
    max_slots: int


@dataclass(frozen=True)
class Work:
    """What one request may start: engine requests at once (main and sidecar), tokens
    generated over all choices, logprob entries built over all choices."""

    engine_requests: int
    tokens: int
    logprob_entries: int


def sidecar_requests(request: ChatCompletionRequest, plan: WorkPlan | None) -> int:
    """Engine requests the sidecar may run at once for one choice of `request` (0 when it
    does not run: no sidecar deployed, no tools, `tool_choice: none`, speculation or the
    sidecar turned off, a baseline engine), as `ChatService.wants_sidecar` decides."""
    options = request.ooo_spec
    mode = request.effective_tool_choice
    if (plan is None or not request.tools or mode == "none" or not options.enabled
            or not options.sidecar or options.baseline is not None):
        return 0
    if not plan.slots_mode or mode not in ("required", "named") or request.parallel_tool_calls:
        return 1
    tools = [t for t in request.tools
             if mode != "named" or t.function.name == request.named_tool]
    # The choice of tool and the prompt's prefill run together first, then every slot at once.
    widest = max((len(slots(t.function.parameters)) for t in tools), default=0)
    return max(2, widest if widest <= plan.max_slots else 0)


def max_tokens_of(request: ChatCompletionRequest, limits: LimitsConfig, context: int,
                  default_max_tokens: int | None) -> int:
    """The most tokens one choice may generate: its `max_tokens`, or what the main replica
    gives a request without one (app.main_model.service.completion_budget's ceiling)."""
    asked = request.max_completion_tokens or request.max_tokens or default_max_tokens
    ceiling = min(limits.max_tokens, context)
    return min(asked, ceiling) if asked is not None else ceiling


def work_of(request: ChatCompletionRequest, choices: int, limits: LimitsConfig, context: int,
            default_max_tokens: int | None, plan: WorkPlan | None) -> Work:
    """The work of `choices` choices of `request` (each runs as `request` does)."""
    tokens = max_tokens_of(request, limits, context, default_max_tokens)
    top = request.top_logprobs or 0
    return Work(
        engine_requests=choices * (1 + sidecar_requests(request, plan)),
        tokens=choices * tokens,
        logprob_entries=choices * tokens * top if request.logprobs else 0,
    )


def check_work(work: Work, limits: LimitsConfig) -> None:
    """A 400 naming the limit when the request asks for more than one request may."""
    if work.tokens > limits.max_request_tokens:
        raise ApiError(
            400,
            f"the request may generate {work.tokens} tokens (choices x max_tokens; a request "
            "without max_tokens counts the server's ceiling); the limit is "
            f"{limits.max_request_tokens} (limits.max_request_tokens): lower n or max_tokens",
            param="max_tokens", code="too_many_tokens_requested",
        )
    if work.logprob_entries > limits.max_logprob_entries:
        raise ApiError(
            400,
            f"the request asks for {work.logprob_entries} logprob entries (choices x "
            f"max_tokens x top_logprobs); the limit is {limits.max_logprob_entries} "
            "(limits.max_logprob_entries): lower top_logprobs, max_tokens or n",
            param="top_logprobs", code="too_many_logprobs",
        )
