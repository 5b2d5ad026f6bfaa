"""What a candidate source (the sidecar, or past calls) hands to the main model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.speculation.canonical import Invocation

# A predicted call is an `Invocation`, the one call type from the sidecar to reconciliation;
# the name stays for the candidate sources that build them.
PredictedCall = Invocation


class Prediction(BaseModel):
    source: Literal["sidecar", "history"] = "sidecar"
    # Top-K alternatives, best first; each alternative is the full list of calls (parallel
    # calling predicts several at once).
    candidates: list[list[PredictedCall]] = Field(default_factory=list)
    no_call: bool = False
    elapsed_ms: float = 0.0
    # The sidecar engine's forward passes this prediction's own engine requests wrote tokens
    # in (a pass its parallel slots shared counts once; other requests' passes never count).
    # Where a pass of a small model costs about the same whatever it holds (a GPU), these
    # against the main model's passes to its call are the readiness; on a CPU, where a pass
    # costs by its tokens, only the times are.
    passes: int = 0
    error: str | None = None
