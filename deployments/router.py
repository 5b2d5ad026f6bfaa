"""`Router` deployment: the OpenAI-compatible HTTP ingress (FastAPI).

Fans each request out to the Sidecar and the MainModel at the same moment: the sidecar call's
`ObjectRef` is handed to the main call inside a list, so the main replica receives the
prediction while it decodes, and the router never waits for the sidecar first. The router
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
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.types import Receive, Scope, Send

from app import telemetry
from app.api.agent_loop import SidecarStart
from app.api.auth import ApiKeys, Caller, ConcurrencyLimiter, Slot
from app.api.chat_service import (
    ChatService,
    choice_requests,
    merge_completions,
    stream_sse,
)
from app.api.completions import CompletionRequest, CompletionService
from app.api.errors import ApiError, describe_validation_errors, error_body
from app.api.limits import deadline_error, read_limited, with_deadline
from app.api.pre_execution import ToolPolicy
from app.api.request_checks import ROUTES, Bounds, Checked, run_checks
from app.api.responses import ResponseBuilder, ResponsesRequest, stream_events
from app.api.sidecar_gate import SidecarGate
from app.api.work import WorkPlan
from app.config import load_config
from app.engine.tool_formats import get_format
from app.engine.turn import TurnError, TurnEvent
from app.openai_models import ChatCompletionRequest
from app.speculation.prediction import Prediction
from app.tenancy import TENANT_KEY
from app.tools.registry import DEFAULT_TIMEOUT_S, ToolResult, ToolSpec
from deployments.metrics import ServeMetrics

logger = logging.getLogger(__name__)

# Beyond a tool's own timeout (which the worker enforces), how long the router waits for the
# worker's answer before it counts the worker as stuck or gone.
TOOL_CALL_GRACE_S = 5.0

# No /docs, /redoc or /openapi.json: they would be open routes beside the keyed /v1 ones, and
# the API is OpenAI's (its own reference documents it).
api = FastAPI(title="ooo-spec", description="OpenAI-compatible tool calling with OoO-Spec",
              docs_url=None, redoc_url=None, openapi_url=None)


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


def _owning_stream(
    content: Any, streams: Sequence[AsyncGenerator[Any, None]], release: Callable[[], None]
) -> ClosingStream:
    """An SSE response that owns the caller's concurrency slot: once it ends, however it
    ends, every stream in `streams` is closed (in order) and the slot released."""

    async def close() -> None:
        try:
            for stream in streams:
                await stream.aclose()
        finally:
            release()

    return ClosingStream(content, close, media_type="text/event-stream")


async def _prefetched(events: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    """`events` with its first item already awaited, so an error that comes before any output
    (messages longer than the context, the main model down) gets its own HTTP status rather
    than an in-band error after a 200."""
    first = await anext(events)

    async def replay() -> AsyncGenerator[Any, None]:
        yield first
        async for item in events:
            yield item

    return replay()


async def _all_prefetched(
    streams: Sequence[AsyncIterator[Any]],
) -> list[AsyncGenerator[Any, None]]:
    """`_prefetched` for every choice at once; if one fails, all are closed."""
    results = await asyncio.gather(*(_prefetched(s) for s in streams), return_exceptions=True)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        for stream, result in zip(streams, results, strict=True):
            if not isinstance(result, BaseException):
                await result.aclose()
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()
        raise failed
    return [r for r in results if not isinstance(r, BaseException)]


async def _all_finals(
    choices: Sequence[AsyncIterator[tuple[str, dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """Every choice's completion; the first failure stops the others and is raised."""
    if len(choices) == 1:
        return [await _final(choices[0])]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_final(events)) for events in choices]
    except BaseExceptionGroup as grouped:
        raise grouped.exceptions[0] from None
    return [task.result() for task in tasks]


async def _final(events: AsyncIterator[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The completion at the end of one choice's events."""
    completion: dict[str, Any] | None = None
    async for kind, event in events:
        if kind == "final":
            completion = event
    assert completion is not None
    return completion


async def _release_on_arrival(ref: Any, release: Callable[[], None]) -> None:
    """Count the sidecar call as pending until its prediction arrives (or fails, or is
    cancelled at the turn's end, which releases it too)."""
    try:
        await ref
    except BaseException:  # any end of the call (answer, error, cancelled) ends its wait
        pass
    finally:
        release()


class _Admission:
    """One admitted POST: the caller, its checked request, and its concurrency slot. The slot
    is released when the route returns, unless a stream takes it over (`hand_over`) to release
    at its end."""

    def __init__(self, caller: Caller, slot: Slot) -> None:
        self.caller = caller
        self.checked: Checked[Any] | None = None
        self._slot: Slot | None = slot

    def request(self, model: type[Any]) -> Any:
        assert self.checked is not None
        return self.checked.of(model)

    def checked_chat(self) -> ChatCompletionRequest:
        assert self.checked is not None
        return self.checked.ask.chat

    def hold(self, engine_requests: int) -> None:
        """The slot grown to what the checked request may start (a 429 when it does not fit)."""
        assert self._slot is not None
        self._slot.resize(engine_requests)

    def hand_over(self) -> Callable[[], None]:
        assert self._slot is not None
        held, self._slot = self._slot, None
        return held.release

    def release(self) -> None:
        if self._slot is not None:
            self._slot.release()


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
        self.keys = ApiKeys.from_config(self.config.auth, os.environ)
        self.limiter = ConcurrencyLimiter(self.config.auth.retry_after_s)
        self.bounds = Bounds(
            self.config.limits, self.config.router.max_body_bytes,
            self.config.main.engine.max_model_len, self.config.router.default_max_tokens,
            WorkPlan(self.config.sidecar.mode == "slots", self.config.limits.max_sidecar_slots)
            if sidecar is not None else None,
        )
        self.started = time.time()

    @contextlib.asynccontextmanager
    async def _admitted(self, raw: Request) -> AsyncIterator[_Admission]:
        """Every POST route's preamble: the key and one engine request of its concurrency
        limit first (nothing else, not even the body, for a refused caller), then the body
        under `router.max_body_bytes`, the route's request checks (app/api/request_checks.py,
        off the event loop), and the slot grown to the engine requests the request may start
        (app/api/work.py)."""
        caller = self._authorize(raw)
        route = ROUTES[raw.scope["route"].path]  # every POST route has its checks there
        admission = _Admission(caller, self.limiter.acquire(caller))
        try:
            body = await read_limited(
                raw.stream(), raw.headers.get("content-length"), self.config.router.max_body_bytes)
            admission.checked = await run_checks(route, body, self.bounds)
            admission.hold(admission.checked.engine_requests)
            yield admission
        finally:
            admission.release()

    def _authorize(self, raw: Request) -> Any:
        return self.keys.authenticate(raw.headers.get("authorization"))

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

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
        async with self._admitted(raw) as admission:
            caller = admission.caller
            request: ChatCompletionRequest = admission.request(ChatCompletionRequest)
            self._check_model(request.model)
            self.chat.check_options(request)
            # `n` > 1: every choice is a request of its own, decoded in parallel.
            trace_parent = telemetry.extract(raw.headers)
            choices = [
                with_deadline(
                    self.chat.events(one, self._start_sidecar, self._main_events,
                                     trace_parent=trace_parent, tenant=caller.tenant),
                    self.config.router.request_timeout_s,
                )
                for one in choice_requests(request)
            ]
            if request.stream:
                replays = await _all_prefetched(choices)
                pairs = [s for pair in zip(replays, choices, strict=True) for s in pair]
                engine = self.config.main.engine
                sse = stream_sse(request, replays, self.chat.model_name,
                                 get_format(engine.tool_format), engine.reasoning_parser)
                return _owning_stream(sse, pairs, admission.hand_over())
            return JSONResponse(merge_completions(await _all_finals(choices)))

    @api.post("/v1/completions", response_model=None)
    async def completions(self, raw: Request) -> JSONResponse | StreamingResponse:
        try:
            async with self._admitted(raw) as admission:
                caller = admission.caller
                request: CompletionRequest = admission.request(CompletionRequest)
                self._check_model(request.model)

                def main_events(payload: dict[str, Any], prompt: Any) -> AsyncIterator[Any]:
                    # The caller's tenant: its own prefix cache, as on the chat route.
                    tenant = {TENANT_KEY: caller.tenant}
                    return self._main_events({**payload, **tenant}, None, prompt)

                timeout = self.config.router.request_timeout_s
                if request.stream:
                    events = await _prefetched(self.text.stream(request, main_events, timeout))
                    return _owning_stream(events, [events], admission.hand_over())
                async with asyncio.timeout(timeout):
                    return JSONResponse(await self.text.complete(request, main_events))
        except TimeoutError:
            raise deadline_error(self.config.router.request_timeout_s) from None

    @api.post("/v1/responses", response_model=None)
    async def responses(self, raw: Request) -> JSONResponse | StreamingResponse:
        async with self._admitted(raw) as admission:
            caller = admission.caller
            request: ResponsesRequest = admission.request(ResponsesRequest)
            self._check_model(request.model)
            chat = admission.checked_chat()  # the chat request it runs as, checked as chat's
            self.chat.check_options(chat)
            events = with_deadline(
                self.chat.events(chat, self._start_sidecar, self._main_events,
                                 trace_parent=telemetry.extract(raw.headers),
                                 tenant=caller.tenant),
                self.config.router.request_timeout_s,
            )
            if request.stream:
                replay = await _prefetched(events)
                return _owning_stream(stream_events(request, chat, replay, self.chat.model_name),
                                      [replay, events], admission.hand_over())
            completion = await _final(events)
            return JSONResponse(
                ResponseBuilder(request, self.chat.model_name).final(completion))

    def _check_model(self, model: str | None) -> None:
        if model and model != self.chat.model_name:
            raise ApiError(404, f"model '{model}' does not exist; this server serves "
                           f"'{self.chat.model_name}'", param="model", code="model_not_found")

    async def _start_sidecar(self, payload: dict[str, Any]) -> SidecarStart | None:
        if self.sidecar is None:
            return None
        release = self.sidecar_gate.admit()
        if release is None:
            # Queued behind the pending ones, the prediction would come too late to draft.
            skipped = Prediction(error=f"skipped: {self.sidecar_gate.pending} sidecar calls "
                                 "pending (speculation.load_aware.sidecar_max_pending)")
            ref = ray.put(skipped.model_dump())  # the main replica reads it like an answer
            return SidecarStart(token=ref, prediction=ref)
        response: Any = self.sidecar.predict.remote(payload)
        try:
            # Waits only for a replica to take the call (instant unless all are busy or one is
            # restarting); the main call must not wait longer than that for the sidecar.
            ref = await asyncio.wait_for(response._to_object_ref(),
                                         self.config.speculation.sidecar_start_timeout_s)
        except asyncio.CancelledError:
            release()
            response.cancel()
            raise
        except Exception as exc:  # TimeoutError, or no sidecar replica at all
            release()
            response.cancel()
            failed = Prediction(error=f"the sidecar did not take the request: "
                                f"{type(exc).__name__}")
            ref = ray.put(failed.model_dump())  # the main replica reads it like an answer
            return SidecarStart(token=ref, prediction=ref)
        arrival = asyncio.ensure_future(_release_on_arrival(ref, release))
        self._arrivals.add(arrival)
        arrival.add_done_callback(self._arrivals.discard)

        def cancel() -> None:
            release()
            response.cancel()

        # The same ref twice: the main replica polls it while decoding, and the router awaits
        # it (each `await` on an ObjectRef is its own future) to pre-execute predicted calls.
        return SidecarStart(token=ref, prediction=ref, cancel=cancel)

    async def _main_events(
        self, payload: dict[str, Any], sidecar_ref: Any, raw_prompt: Any = None
    ) -> AsyncIterator[TurnEvent]:
        """The main replica's events; the `TurnError` it hands over is raised here."""
        refs = [sidecar_ref] if sidecar_ref is not None else []
        baseline = (payload.get("ooo_spec") or {}).get("baseline")
        main = self.baselines[baseline] if baseline else self.main
        stream: Any = None
        finished = False
        try:
            stream = (main.generate.remote(payload, refs) if raw_prompt is None
                      else main.generate.remote(payload, refs, raw_prompt))
            async for event in stream:
                if isinstance(event, TurnError):
                    raise event
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
