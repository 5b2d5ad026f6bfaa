"""The OpenAI error envelope: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.speculation.turn import TurnError

M = TypeVar("M", bound=BaseModel)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error the client caused or should know about; becomes an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def api_error(err: TurnError) -> ApiError:
    """The HTTP error for a request the engine layer cannot serve as asked: the client's
    to fix."""
    return ApiError(400, err.message, param=err.param, code=err.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": encodable(message),
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": None if param is None else encodable(param),
            "code": code,
        }
    }


def encodable(text: str) -> str:
    """`text` with any lone surrogate (a client's `"\\ud800"` quoted in a message or a field's
    path) written as its escape, so the error itself can be sent as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def validated(model: type[M], data: Any) -> M:
    """`data` as a `model`, or a 400 with a readable message naming the first offending field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe_validation_errors(exc.errors())
        raise ApiError(400, message, param=param) from None


def describe_validation_errors(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """One readable message (and the first offending field) from pydantic/FastAPI errors."""
    parts = []
    param: str | None = None
    for err in errors[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        where = ".".join(loc)
        if param is None and where:
            param = where
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request", param
