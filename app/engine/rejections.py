"""vLLM's refusals of a request as the client's error, told apart from a failing replica.

vLLM checks a request's values where it builds its `SamplingParams` (`stop: [""]`, a
temperature out of range) and where it takes the request in (an empty or too long prompt,
token ids outside the vocabulary), raising a `VLLMClientError` (or a plain `ValueError` from
older paths); the engine layer hands the latter on as `RequestRejected`. The model's chat
template can refuse a conversation too (`raise_exception`, e.g. roles that do not alternate).
Each is the request's fault: a `TurnError` (a 400 at the API) naming the field, never an
exception that the router would take for the main replica being down.
"""

from __future__ import annotations

from app.engine.vllm_engine import RequestRejected
from app.speculation.turn import TurnError

# The sampling options the engine layer passes to vLLM, by the request field each comes from.
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                   "seed": "seed", "stop": "stop", "logprobs": "logprobs"}


def rejected_field(message: str, parameter: str | None) -> str | None:
    """The request field a refusal names: vLLM's own `parameter`, else the sampling option
    its message starts with ("stop cannot contain an empty string."), else `prompt` for a
    refused prompt; None when it names none (a schema the grammar backend refuses)."""
    if parameter:
        return SAMPLING_FIELDS.get(parameter, parameter)
    first = message.split(" ", 1)[0].strip(".:`'")
    if first in SAMPLING_FIELDS:
        return SAMPLING_FIELDS[first]
    if "prompt" in message.lower():
        return "prompt"
    return None


def _client_error(exc: BaseException) -> bool:
    from vllm.exceptions import VLLMClientError

    return isinstance(exc, VLLMClientError)


def _template_error(exc: BaseException) -> bool:
    import jinja2

    return isinstance(exc, jinja2.TemplateError)


def engine_rejection(exc: BaseException) -> TurnError | None:
    """`exc` as the client's error when vLLM (or the model's chat template, whose
    `raise_exception` refuses a conversation it cannot render) refused the request; None for
    anything else."""
    if _template_error(exc):
        return TurnError(f"the model's chat template refused the messages: {exc}",
                         param="messages", code="rejected_by_engine")
    if isinstance(exc, RequestRejected):
        cause = exc.__cause__
        parameter = getattr(cause, "parameter", None)
    elif _client_error(exc):
        parameter = getattr(exc, "parameter", None)
    else:
        return None
    message = str(exc)
    field = rejected_field(message, parameter if isinstance(parameter, str) else None)
    if field is not None:
        text = f"the engine rejected the request's '{field}': {message}"
    else:
        text = ("the engine rejected the request (with a forced tool call, usually a tool "
                f"schema it cannot turn into a grammar): {message}")
    return TurnError(text, param=field, code="rejected_by_engine")
