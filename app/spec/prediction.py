"""What a candidate source (the sidecar, or past calls) hands to the main model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class PredictedCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Prediction(BaseModel):
    source: Literal["sidecar", "history"] = "sidecar"
    # Top-K alternatives, best first; each alternative is the full list of calls (parallel
    # calling predicts several at once).
    candidates: list[list[PredictedCall]] = Field(default_factory=list)
    no_call: bool = False
    elapsed_ms: float = 0.0
    error: str | None = None
