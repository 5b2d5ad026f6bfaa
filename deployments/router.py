"""`Router` deployment: the OpenAI-compatible HTTP ingress (FastAPI).

Fans each request out to the Sidecar and the MainModel at the same moment: the sidecar call's
`ObjectRef` is handed to the main call inside a list, so the main replica receives the
prediction while it decodes, and the router never waits for the sidecar first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.api.chat_service import ChatService, parse_request, stream_sse
from app.api.errors import ApiError, describe_validation_errors, error_body
from app.config import load_config

api = FastAPI(title="ooo-spec", description="OpenAI-compatible tool calling with OoO-Spec")


@api.exception_handler(ApiError)
async def _api_error(_: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    message, param = describe_validation_errors(list(err.errors()))
    return JSONResponse(error_body(400, message, param), status_code=400)


@api.exception_handler(404)
async def _not_found(request: Request, _: Exception) -> JSONResponse:
    return JSONResponse(error_body(404, f"no route {request.method} {request.url.path}"),
                        status_code=404)


@serve.deployment(name="Router")
@serve.ingress(api)
class Router:
    def __init__(
        self,
        config: dict[str, Any],
        main: DeploymentHandle,
        sidecar: DeploymentHandle | None,
    ) -> None:
        self.config = load_config(config)
        self.main = main.options(stream=True)
        self.sidecar = sidecar
        self.chat = ChatService(
            self.config.main.engine.served_model_name, sidecar_enabled=sidecar is not None
        )
        self.started = time.time()

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.chat.model_name, "object": "model",
                      "created": int(self.started), "owned_by": "ooo-spec"}],
        }

    @api.get("/v1/models/{model_id}")
    async def model(self, model_id: str) -> dict[str, Any]:
        if model_id != self.chat.model_name:
            raise ApiError(404, f"model '{model_id}' does not exist", param="model",
                           code="model_not_found")
        return {"id": model_id, "object": "model", "created": int(self.started),
                "owned_by": "ooo-spec"}

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(self, raw: Request) -> JSONResponse | StreamingResponse:
        body = await raw.body()
        request = parse_request(body, self.config.router.max_body_bytes)
        if request.model and request.model != self.chat.model_name:
            raise ApiError(404, f"model '{request.model}' does not exist; this server serves "
                           f"'{self.chat.model_name}'", param="model", code="model_not_found")
        events = self.chat.events(request, self._start_sidecar, self._main_events)
        if request.stream:
            return StreamingResponse(
                stream_sse(request, events, self.chat.model_name),
                media_type="text/event-stream",
            )
        completion: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(self.config.router.request_timeout_s):
                async for kind, event in events:
                    if kind == "final":
                        completion = event
        except TimeoutError:
            raise ApiError(503, "the request took longer than the server's deadline of "
                           f"{self.config.router.request_timeout_s:.0f} s") from None
        assert completion is not None
        return JSONResponse(completion)

    async def _start_sidecar(self, payload: dict[str, Any]) -> Any:
        if self.sidecar is None:
            return None
        response: Any = self.sidecar.predict.remote(payload)
        return await response._to_object_ref()

    async def _main_events(
        self, payload: dict[str, Any], sidecar_ref: Any
    ) -> AsyncIterator[dict[str, Any]]:
        refs = [sidecar_ref] if sidecar_ref is not None else []
        try:
            stream: Any = self.main.generate.remote(payload, refs)
            async for event in stream:
                yield event
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(503, f"the main model is unavailable: {type(exc).__name__}",
                           code="main_unavailable") from None
