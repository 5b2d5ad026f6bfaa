"""`Router` deployment: the OpenAI-compatible HTTP ingress (FastAPI).

Fans each request out to the Sidecar and the MainModel at the same moment: the sidecar call's
`ObjectRef` is handed to the main call inside a list, so the main replica receives the
prediction while it decodes, and the router never waits for the sidecar first. The router
awaits the same `ObjectRef` itself in the background to pre-execute predicted calls on the
ToolWorker pool (app.api.agent_loop), and runs committed calls there for `execute_tools`.
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

from app.api.agent_loop import SidecarStart, ToolPolicy
from app.api.chat_service import ChatService, parse_request, stream_sse
from app.api.errors import ApiError, describe_validation_errors, error_body
from app.config import load_config
from app.tools.registry import ToolResult, ToolSpec

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


class PoolTools:
    """The ToolWorker pool behind `app.api.agent_loop.ToolAccess`.

    The registry does not change while the app runs (MCP tools are listed at startup), so the
    specs and the `GET /v1/tools` listing are fetched once per router replica and cached."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle
        self._specs: dict[str, ToolSpec] | None = None
        self._listing: list[dict[str, Any]] | None = None
        self._lock = asyncio.Lock()

    async def specs(self) -> dict[str, ToolSpec]:
        if self._specs is None:
            async with self._lock:  # concurrent first requests fetch once
                if self._specs is None:
                    raw: list[dict[str, Any]] = await self.handle.tool_specs.remote()
                    self._specs = {s["name"]: ToolSpec.model_validate(s) for s in raw}
        return self._specs

    async def listing(self) -> list[dict[str, Any]]:
        if self._listing is None:
            self._listing = await self.handle.list_tools.remote()
        return self._listing

    async def execute(
        self, name: str, arguments: dict[str, Any], speculative: bool
    ) -> ToolResult:
        response: Any = self.handle.execute.remote(name, arguments, speculative=speculative)
        try:
            raw = await response
        except asyncio.CancelledError:
            # A misprediction (or a dropped request): free the worker's slot, stop the tool.
            response.cancel()
            raise
        return ToolResult.model_validate(raw)


@serve.deployment(name="Router")
@serve.ingress(api)
class Router:
    def __init__(
        self,
        config: dict[str, Any],
        main: DeploymentHandle,
        sidecar: DeploymentHandle | None,
        tool_worker: DeploymentHandle | None = None,
        main_ngram: DeploymentHandle | None = None,
    ) -> None:
        self.config = load_config(config)
        self.main = main.options(stream=True)
        # Comparison engines by the name requests give in `ooo_spec.baseline`.
        self.baselines = {"ngram": main_ngram.options(stream=True)} if main_ngram else {}
        self.sidecar = sidecar
        self.pool = PoolTools(tool_worker) if tool_worker is not None else None
        settings = self.config.tool_worker
        self.chat = ChatService(
            self.config.main.engine.served_model_name,
            sidecar_enabled=sidecar is not None,
            tools=self.pool,
            policy=ToolPolicy(settings.pre_execute, settings.allow_egress),
            baselines=list(self.baselines),
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

    @api.get("/v1/tools")
    async def list_tools(self) -> dict[str, Any]:
        """Server-registered tools; clients copy entries into `tools` to let the server run
        (and pre-execute) them."""
        if self.pool is None:
            return {"object": "list", "data": []}
        try:
            listing = await self.pool.listing()
        except Exception as exc:
            raise ApiError(503, f"the tool workers are unavailable: {type(exc).__name__}",
                           code="tools_unavailable") from None
        return {"object": "list", "data": listing}

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(self, raw: Request) -> JSONResponse | StreamingResponse:
        body = await raw.body()
        request = parse_request(body, self.config.router.max_body_bytes)
        if request.model and request.model != self.chat.model_name:
            raise ApiError(404, f"model '{request.model}' does not exist; this server serves "
                           f"'{self.chat.model_name}'", param="model", code="model_not_found")
        self.chat.check_options(request)
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

    async def _start_sidecar(self, payload: dict[str, Any]) -> SidecarStart | None:
        if self.sidecar is None:
            return None
        response: Any = self.sidecar.predict.remote(payload)
        ref = await response._to_object_ref()
        # The same ref twice: the main replica polls it while decoding, and the router awaits
        # it (each `await` on an ObjectRef is its own future) to pre-execute predicted calls.
        return SidecarStart(token=ref, prediction=ref)

    async def _main_events(
        self, payload: dict[str, Any], sidecar_ref: Any
    ) -> AsyncIterator[dict[str, Any]]:
        refs = [sidecar_ref] if sidecar_ref is not None else []
        baseline = (payload.get("ooo_spec") or {}).get("baseline")
        main = self.baselines[baseline] if baseline else self.main
        try:
            stream: Any = main.generate.remote(payload, refs)
            async for event in stream:
                yield event
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(503, f"the main model is unavailable: {type(exc).__name__}",
                           code="main_unavailable") from None
