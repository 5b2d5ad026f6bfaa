"""One POST request's way through the router, called once per request by the `Router`
deployment (deployments/router.py), which only translates HTTP and Ray in and out.

Admission first: the key and one engine request of its concurrency limit (nothing else, not
even the body, for a refused caller), then the body under `router.max_body_bytes` and within
`router.body_timeout_s` (else a 408, the slot released), the route's request checks
(app/api/request_checks.py, in the router's check pool, in the caller's tenant's share) and
the slot grown to the engine requests the request may start (app/api/work.py). Then the
fan-out: each of `n` choices is a request of its own, decoded in parallel. A streamed
response has its first event awaited before it is returned (`prefetched`), so an error that
comes before any output gets its own HTTP status rather than an in-band error after a 200;
the stream then owns the slot and releases it however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from app import telemetry
from app.api.auth import ApiKeys, Caller, ConcurrencyLimiter, Slot
from app.api.chat_service import ChatService, StartSidecar, choice_requests, merge_completions
from app.api.completions import CompletionRequest, CompletionService
from app.api.errors import ApiError, api_error
from app.api.limits import deadline_error, read_limited, with_deadline
from app.api.main_format import main_format_async, warm_main_format
from app.api.messages import CountTokensRequest, MessagesRequest, to_message
from app.api.messages import stream_events as message_events
from app.api.request_checks import ROUTES, Bounds, Checked, run_checks
from app.api.responses import ResponseBuilder, ResponsesRequest, stream_events
from app.api.streaming import choice_chunks, stream_sse
from app.api.tokenize import DetokenizeRequest, TokenizeRequest
from app.api.work import WorkPlan, max_tokens_of
from app.check_pool import CheckPool
from app.config import AppConfig, DiagnosticsConfig
from app.formats.structural_tag import engine_tag_model
from app.openai_models import ChatCompletionRequest
from app.speculation.turn import TurnError, TurnEvent
from app.tenancy import TENANT_KEY

# The routes whose requests run as chat requests (`RequestFlow._as_chat`).
RouteRequest = TypeVar("RouteRequest", ResponsesRequest, MessagesRequest)


class MainCall(Protocol):
    """The main replica's events for a payload, with the sidecar's ref (or None) and, on
    /v1/completions, the raw prompt; raises the `TurnError` the replica hands back."""

    def __call__(self, payload: dict[str, Any], sidecar_ref: Any,
                 raw_prompt: Any = None) -> AsyncIterator[TurnEvent]: ...


class CountCall(Protocol):
    """The main model's count of a payload's prompt tokens, as its template and tokenizer
    render it (`MainModel.count_tokens`); raises the `TurnError` the replica hands back."""

    def __call__(self, payload: dict[str, Any]) -> Awaitable[int]: ...


class TokensCall(Protocol):
    """The main replica's tokenizer (`MainModel.tokens`): a `/tokenize` or `/detokenize`
    order in, vLLM's response body out; raises the `TurnError` the replica hands back."""

    def __call__(self, order: dict[str, Any]) -> Awaitable[dict[str, Any]]: ...


@dataclass(frozen=True)
class Incoming:
    """What the flow reads of an HTTP request: the route's path (its key in `ROUTES`), the
    headers, and the body as it arrives."""

    path: str
    headers: Mapping[str, str]
    body: AsyncIterator[bytes]


@dataclass(frozen=True)
class JsonReply:
    body: dict[str, Any]


@dataclass(frozen=True)
class StreamReply:
    """Server-sent events; `close` runs however the response ends (the streams closed, the
    caller's slot released), also when the client left before the first chunk."""

    chunks: AsyncIterator[str]
    close: Callable[[], Awaitable[None]]


Reply = JsonReply | StreamReply


class Admission:
    """One admitted POST: the caller, its checked request, and its concurrency slot. The slot
    is released when the route returns, unless a stream takes it over (`hand_over`)."""

    def __init__(self, caller: Caller, slot: Slot, checked: Checked[Any]) -> None:
        self.caller = caller
        self.checked = checked
        self._slot: Slot | None = slot

    def hand_over(self) -> Callable[[], None]:
        assert self._slot is not None
        held, self._slot = self._slot, None
        return held.release

    def release(self) -> None:
        if self._slot is not None:
            self._slot.release()


def owning_stream(chunks: AsyncIterator[str], streams: Sequence[AsyncGenerator[Any, None]],
                  release: Callable[[], None]) -> StreamReply:
    """A stream that owns the caller's slot: once it ends, however it ends, every stream in
    `streams` is closed (in order) and the slot released."""

    async def close() -> None:
        try:
            for stream in streams:
                await stream.aclose()
        finally:
            release()

    return StreamReply(chunks, close)


async def prefetched(events: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    """`events` with its first item already awaited, so an error that comes before any output
    (messages longer than the context, the main model down) gets its own HTTP status."""
    first = await anext(events)

    async def replay() -> AsyncGenerator[Any, None]:
        yield first
        async for item in events:
            yield item

    return replay()


async def all_prefetched(
    streams: Sequence[AsyncIterator[Any]],
) -> list[AsyncGenerator[Any, None]]:
    """`prefetched` for every choice at once; if one fails, all are closed."""
    results = await asyncio.gather(*(prefetched(s) for s in streams), return_exceptions=True)
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


async def final(events: AsyncIterator[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The completion at the end of one choice's events."""
    completion: dict[str, Any] | None = None
    async for kind, event in events:
        if kind == "final":
            completion = event
    assert completion is not None
    return completion


async def all_finals(
    choices: Sequence[AsyncIterator[tuple[str, dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """Every choice's completion; the first failure stops the others and is raised."""
    if len(choices) == 1:
        return [await final(choices[0])]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(final(events)) for events in choices]
    except BaseExceptionGroup as grouped:
        raise grouped.exceptions[0] from None
    return [task.result() for task in tasks]


def check_diagnostics(request: ChatCompletionRequest, allowed: DiagnosticsConfig) -> None:
    """A 400 for a diagnostics switch the config does not allow: each suffix scope is an
    index of the tenant's, so it is open only where a benchmark needs it."""
    if request.ooo_spec.diagnostics.suffix_scope is not None and not allowed.suffix_scopes:
        raise ApiError(400, "ooo_spec.diagnostics.suffix_scope is a benchmark switch this "
                       "server does not allow (config `diagnostics.suffix_scopes`); leave it "
                       "out", param="ooo_spec.diagnostics.suffix_scope",
                       code="diagnostics_disabled")


class RequestFlow:
    """The POST routes' logic over the deployment's calls: `start_sidecar` and `main_call`
    reach the Sidecar and MainModel deployments; `chat` and `text` build the responses."""

    def __init__(self, config: AppConfig, keys: ApiKeys, chat: ChatService,
                 text: CompletionService, start_sidecar: StartSidecar, main_call: MainCall,
                 sidecar_deployed: bool, check_pool: CheckPool | None = None,
                 count_call: CountCall | None = None,
                 tokens_call: TokensCall | None = None) -> None:
        self.config = config
        self.keys = keys
        self.chat = chat
        self.text = text
        self.start_sidecar = start_sidecar
        self.main_call = main_call
        self.count_call = count_call
        self.tokens_call = tokens_call
        self.limiter = ConcurrencyLimiter(config.auth.retry_after_s)
        warm_main_format(config.main.engine)  # a vLLM-read format loads before it streams
        # The router's request checks, in a bounded pool fair between tenants, like the
        # replicas' grammar checks (app/check_pool.py).
        limits = config.limits
        self.check_pool = check_pool or CheckPool(
            limits.check_threads, min(limits.check_threads_per_tenant, limits.check_threads),
            "router-checks")
        self.bounds = Bounds(
            config.limits, config.router.max_body_bytes, config.main.engine.max_model_len,
            config.router.default_max_tokens,
            WorkPlan(config.sidecar.mode == "slots", config.limits.max_sidecar_slots)
            if sidecar_deployed else None,
        )

    def authorize(self, headers: Mapping[str, str]) -> Caller:
        # `x-api-key`: how Anthropic's clients send the key (app/api/messages.py).
        return self.keys.authenticate(headers.get("authorization"), headers.get("x-api-key"))

    def check_model(self, model: str | None) -> None:
        if model and model != self.chat.model_name:
            raise ApiError(404, f"model '{model}' does not exist; this server serves "
                           f"'{self.chat.model_name}'", param="model", code="model_not_found")

    @contextlib.asynccontextmanager
    async def admitted(self, incoming: Incoming) -> AsyncIterator[Admission]:
        """Every POST route's preamble (see the module's docstring); the slot is released on
        leaving unless a stream took it over."""
        caller = self.authorize(incoming.headers)
        route = ROUTES[incoming.path]  # every POST route has its checks there
        slot = self.limiter.acquire(caller)
        try:
            body = await read_limited(incoming.body, incoming.headers.get("content-length"),
                                      self.config.router.max_body_bytes,
                                      self.config.router.body_timeout_s)
            checked = await run_checks(route, body, self.bounds, self.check_pool, caller.tenant)
            check_diagnostics(checked.ask.chat, self.config.diagnostics)
            slot.resize(checked.engine_requests)
        except BaseException:
            slot.release()
            raise
        admission = Admission(caller, slot, checked)
        try:
            yield admission
        finally:
            admission.release()

    def _chat_events(self, request: ChatCompletionRequest, incoming: Incoming,
                     caller: Caller) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        return with_deadline(
            self.chat.events(request, self.start_sidecar, self.main_call,
                             trace_parent=telemetry.extract(incoming.headers),
                             tenant=caller.tenant,
                             # The agent loop's turns share what the checks counted.
                             token_budget=max_tokens_of(request, self.config.limits,
                                                        self.bounds.context,
                                                        self.bounds.default_max_tokens)),
            self.config.router.request_timeout_s,
        )

    async def chat_completions(self, incoming: Incoming) -> Reply:
        async with self.admitted(incoming) as admission:
            request = admission.checked.of(ChatCompletionRequest)
            self.check_model(request.model)
            self.chat.check_options(request)
            choices = [self._chat_events(one, incoming, admission.caller)
                       for one in choice_requests(request)]
            if request.stream:
                replays = await all_prefetched(choices)
                pairs = [s for pair in zip(replays, choices, strict=True) for s in pair]
                engine = self.config.main.engine
                sse = stream_sse(request, replays, self.chat.model_name,
                                 await main_format_async(engine), engine.reasoning_parser,
                                 engine_tag_model(engine) is not None)
                return owning_stream(sse, pairs, admission.hand_over())
            return JsonReply(merge_completions(await all_finals(choices)))

    async def completions(self, incoming: Incoming) -> Reply:
        timeout = self.config.router.request_timeout_s
        try:
            async with self.admitted(incoming) as admission:
                request = admission.checked.of(CompletionRequest)
                self.check_model(request.model)
                tenant = {TENANT_KEY: admission.caller.tenant}

                def main_events(payload: dict[str, Any], prompt: Any) -> AsyncIterator[Any]:
                    # The caller's tenant: its own prefix cache, as on the chat route.
                    return self.main_call({**payload, **tenant}, None, prompt)

                if request.stream:
                    events = await prefetched(self.text.stream(request, main_events, timeout))
                    return owning_stream(events, [events], admission.hand_over())
                async with asyncio.timeout(timeout):
                    return JsonReply(await self.text.complete(request, main_events))
        except TimeoutError:
            raise deadline_error(timeout) from None

    async def choice_chunks(
        self, chat: ChatCompletionRequest, events: AsyncIterator[tuple[str, dict[str, Any]]],
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One choice's chat chunks, read as the main model writes (its tool format, reasoning
        parser and forced-call syntax): what the Responses and Messages streams translate."""
        engine = self.config.main.engine
        return choice_chunks(chat, events, self.chat.model_name,
                             await main_format_async(engine),
                             engine.reasoning_parser, engine_tag_model(engine) is not None)

    async def responses(self, incoming: Incoming) -> Reply:
        """`POST /v1/responses`: the chat request it runs as, its result as a `response` or
        the Responses event stream (app/api/responses.py)."""
        return await self._as_chat(
            incoming, ResponsesRequest,
            lambda request, done: ResponseBuilder(request, self.chat.model_name).final(done),
            lambda request, chunks: stream_events(request, chunks, self.chat.model_name))

    async def messages(self, incoming: Incoming) -> Reply:
        """`POST /v1/messages`: the chat request it runs as, its result as a `message` or the
        Messages event stream (app/api/messages.py)."""
        return await self._as_chat(
            incoming, MessagesRequest,
            lambda _, done: to_message(done, self.chat.model_name),
            lambda _, chunks: message_events(chunks, self.chat.model_name))

    async def _as_chat(
        self, incoming: Incoming, kind: type[RouteRequest],
        answer: Callable[[RouteRequest, dict[str, Any]], dict[str, Any]],
        stream_of: Callable[[RouteRequest, AsyncIterator[tuple[str, dict[str, Any]]]],
                            AsyncIterator[str]],
    ) -> Reply:
        """A route whose request runs as a chat request (checked as chat's): `answer` makes
        its reply of the finished completion, `stream_of` its event stream of the chat
        chunks."""
        async with self.admitted(incoming) as admission:
            request = admission.checked.of(kind)
            self.check_model(request.model)
            chat = admission.checked.ask.chat  # the chat request it runs as, checked as chat's
            self.chat.check_options(chat)
            events = self._chat_events(chat, incoming, admission.caller)
            if request.stream:
                replay = await prefetched(events)
                chunks = await self.choice_chunks(chat, replay)
                return owning_stream(stream_of(request, chunks), [replay, events],
                                     admission.hand_over())
            return JsonReply(answer(request, await final(events)))

    async def count_tokens(self, incoming: Incoming) -> Reply:
        """`POST /v1/messages/count_tokens`: the prompt's tokens as the main model renders it
        (its chat template, the tools, the tokenizer), nothing decoded."""
        async with self.admitted(incoming) as admission:
            request = admission.checked.of(CountTokensRequest)
            self.check_model(request.model)
            if self.count_call is None:
                raise ApiError(501, "this server cannot count tokens", code="not_implemented")
            payload = {**admission.checked.ask.chat.model_dump(exclude_none=True),
                       TENANT_KEY: admission.caller.tenant}
            try:
                async with asyncio.timeout(self.config.router.request_timeout_s):
                    tokens = await self.count_call(payload)
            except TurnError as err:
                raise api_error(err) from None
            except TimeoutError:
                raise deadline_error(self.config.router.request_timeout_s) from None
            return JsonReply({"input_tokens": tokens})

    async def tokens(self, incoming: Incoming) -> Reply:
        """`POST /tokenize` and `POST /detokenize` (app/api/tokenize.py): checked and keyed
        like the other routes, answered by the main replica's tokenizer."""
        async with self.admitted(incoming) as admission:
            request = admission.checked.request
            if not isinstance(request, TokenizeRequest | DetokenizeRequest):
                raise TypeError(f"not a tokenizer request: {type(request).__name__}")
            self.check_model(request.model)
            if self.tokens_call is None:
                raise ApiError(501, "this server cannot tokenize", code="not_implemented")
            order: dict[str, Any]
            if isinstance(request, DetokenizeRequest):
                if len(request.tokens) > self.bounds.context:
                    raise ApiError(400, f"'tokens' holds {len(request.tokens)} ids, more than "
                                   f"the model's context of {self.bounds.context}",
                                   param="tokens")
                order = {"op": "detokenize", "tokens": request.tokens}
            else:
                order = {"op": "tokenize",
                         "chat": {**admission.checked.ask.chat.model_dump(exclude_none=True),
                                  TENANT_KEY: admission.caller.tenant},
                         "prompt": request.prompt, "special": request.special_tokens,
                         "strs": bool(request.return_token_strs)}
            try:
                async with asyncio.timeout(self.config.router.request_timeout_s):
                    return JsonReply(await self.tokens_call(order))
            except TurnError as err:
                raise api_error(err) from None
            except TimeoutError:
                raise deadline_error(self.config.router.request_timeout_s) from None
