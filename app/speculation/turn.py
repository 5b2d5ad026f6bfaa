"""The turn contract: what one main-model turn hands back to the router.

While decoding, the main replica yields a `TurnDelta` per forward pass that produced text; at
the end, one `TurnResult`; on a turn that calls the sidecar, a `SidecarCalled` as soon as the
call has a sidecar replica. When the engine layer cannot serve the request as asked (messages
longer than the context, a grammar that does not compile, a schema vLLM refuses) it raises a
`TurnError`: the client's to fix. The `MainModel` deployment hands that error across the Ray
boundary and the router raises it again; only `app/api` turns it into an HTTP error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.openai_models import CandidateReport, MainReport
from app.speculation.canonical import Invocation

SidecarStatus = Literal["pending", "received", "error", "late", "none"]


class TurnError(Exception):
    """The request cannot be served as asked (an HTTP 400 at the API): `message` for the
    client, the request field at fault (`param`) and a machine-readable `code`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        # All three in `args`: the error is pickled across the Ray boundary and rebuilt from them.
        super().__init__(message, param, code)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class TurnDelta:
    """Text of one forward pass; `logprobs` already in the route's shape (a chat
    `logprobs.content` list, or a completion choice's `logprobs` object)."""

    text: str
    logprobs: Any = None


@dataclass(frozen=True)
class SidecarCalled:
    """The main replica's word, as soon as it has it, on a turn it was asked to start the
    sidecar for (before the first `TurnDelta` unless that call waits longer than the prefill):
    the call reached a sidecar replica (`prediction`: the Ray `ObjectRef` of its `Prediction`
    dict), or none took it in time (`prediction` then refers to a failed `Prediction`). The
    main replica makes that call beside its own prefill, so no wait for a sidecar replica comes
    before it; the router takes this event out of the stream for pre-execution and the
    report."""

    prediction: Any


@dataclass(frozen=True)
class SidecarDelivery:
    """What became of the sidecar's answer inside the main replica."""

    status: SidecarStatus = "none"
    error: str | None = None
    elapsed_ms: float = 0.0  # inside the sidecar
    no_call: bool = False


@dataclass(frozen=True)
class TurnResult:
    """One turn's output, parsed: the committed calls, the usage and the turn's report."""

    text: str  # everything the model wrote, reasoning included
    content: str | None  # the answer's text, calls and reasoning taken out
    reasoning: str | None
    calls: list[Invocation]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    main: MainReport
    candidates: list[CandidateReport]
    sidecar: SidecarDelivery
    main_ms: float  # from the replica taking the call to the result
    logprobs: Any = None  # the whole output's, in the route's shape
    # The Serve replica that ran it (set by the deployment; None outside Serve).
    replica: str | None = None
    # The stop string that ended the output, if one did (vLLM's `stop_reason`).
    stop_reason: str | None = None


TurnEvent = TurnDelta | TurnResult
