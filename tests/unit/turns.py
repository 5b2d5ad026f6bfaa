"""`TurnResult`s for the router's unit tests: what a scripted main model commits."""

from __future__ import annotations

from typing import Any

from app.openai_models import CandidateReport, MainReport
from app.speculation.canonical import Invocation
from app.speculation.turn import SidecarDelivery, SidecarStatus, TurnResult


def turn_result(
    calls: list[dict[str, Any]] | None = None,
    content: str | None = None,
    *,
    text: str = "",
    finish_reason: str | None = "stop",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    main: MainReport | None = None,
    candidates: list[CandidateReport] | None = None,
    sidecar: SidecarStatus = "received",
    sidecar_ms: float = 5.0,
    main_ms: float = 30.0,
    logprobs: Any = None,
    reasoning: str | None = None,
) -> TurnResult:
    return TurnResult(
        text=text,
        content=content,
        reasoning=reasoning,
        calls=[Invocation.model_validate(c) for c in calls or []],
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        token_ids=[],
        main=main or MainReport(steps=3, completion_tokens=completion_tokens, drafted_tokens=4,
                                accepted_tokens=2, ttft_ms=7.0, decode_ms=20.0),
        candidates=candidates or [],
        sidecar=SidecarDelivery(status=sidecar, elapsed_ms=sidecar_ms),
        main_ms=main_ms,
        logprobs=logprobs,
    )
