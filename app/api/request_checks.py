"""The request checks every route runs before any model work, in one place.

A route declares how its body becomes its request model (`Route.parse`) and what that request
asks of the engines in the shared terms (`Route.ask`: the chat request each choice runs, how
many choices, how many seeds per prompt). `check_body` runs the body limits (the JSON parsed
strictly, every string checked to be encodable: app/api/json_body.py), the route's parse and the
shared limits (`check_ask`: counts and sizes, then every client schema validated, then the work
counted) and returns a `Checked`, the only way a route's handler gets its request; whatever
a check did not foresee is still a 400 naming the field (`checking`), never a 5xx.
`run_checks` runs all of it off the event loop under the CPU-time limit, so a slow schema
cannot stall the router. `ROUTES` maps each POST path to its `Route`: the router reads
its route from there, and a unit test fails when a POST route of the app is not in it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.api.completions import CompletionRequest
from app.api.errors import ApiError, validated
from app.api.json_body import check_text
from app.api.limits import (
    check_arguments,
    check_body_depth,
    check_max_tokens,
    check_messages,
    check_output_schema,
    check_stop,
    check_tools,
    in_pool,
    json_object_body,
    off_loop,
)
from app.api.messages import (
    COUNT_TOKENS_PATH,
    MESSAGES_PATH,
    CountTokensRequest,
    MessagesRequest,
    count_chat_request,
)
from app.api.messages import to_chat_request as messages_chat_request
from app.api.responses import ResponsesRequest, to_chat_request
from app.api.tokenize import DETOKENIZE_PATH, TOKENIZE_PATH, DetokenizeRequest, TokenizeRequest
from app.api.work import WorkPlan, check_work, work_of
from app.check_pool import CheckPool, stop_if_abandoned
from app.config import LimitsConfig
from app.openai_models import SEED_MAX, SEED_MIN, ChatCompletionRequest
from app.speculation.validation import check_schema
from app.tenancy import ANONYMOUS_TENANT

R = TypeVar("R")
M = TypeVar("M")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bounds:
    """What the checks read besides the request: the limits, the body's size cap, the main
    model's context length, the `max_tokens` of a request that gives none (None: the rest of
    the context) and how the sidecar's work is counted (None: no sidecar deployed)."""

    limits: LimitsConfig
    max_body_bytes: int
    context: int
    default_max_tokens: int | None = None
    work: WorkPlan | None = None


@dataclass(frozen=True)
class Ask:
    """What a route's request asks of the engines, in the shared limits' terms: the chat
    request each choice runs (the main replica takes every route's request as one), the
    choices in all, and the seeds one prompt uses (choice i of a prompt samples with
    `seed + i`, as vLLM's parallel sampling)."""

    chat: ChatCompletionRequest
    choices: int
    seeds: int


@dataclass(frozen=True)
class Route(Generic[R]):
    """One POST route's request: its wire model from the JSON body, and its `Ask`."""

    name: str
    parse: Callable[[dict[str, Any]], R]
    ask: Callable[[R], Ask]


@dataclass(frozen=True)
class Checked(Generic[R]):
    """A request that passed every check, with what it asks and the engine requests it may
    start at once (what the per-key concurrency limit counts)."""

    request: R
    ask: Ask
    engine_requests: int

    def of(self, model: type[M]) -> M:
        """The request as the route's own model (a route reads only its own)."""
        if not isinstance(self.request, model):
            raise TypeError(f"checked request is a {type(self.request).__name__}, "
                            f"not a {model.__name__}")
        return self.request


def _chat_ask(request: ChatCompletionRequest) -> Ask:
    return Ask(request, request.n or 1, request.n or 1)


def _completion_ask(request: CompletionRequest) -> Ask:
    # Choice i of every prompt samples with seed + i: the prompts share the seeds.
    return Ask(request.chat_request(0), len(request.prompts()) * request.n, request.n)


def _responses_ask(request: ResponsesRequest) -> Ask:
    return Ask(to_chat_request(request), 1, 1)


def _messages_ask(request: MessagesRequest) -> Ask:
    return Ask(messages_chat_request(request), 1, 1)


def _count_tokens_ask(request: CountTokensRequest) -> Ask:
    # Renders and tokenises the prompt on the main replica, decodes nothing: checked as the
    # chat request of one token it would be.
    return Ask(count_chat_request(request), 1, 1)


CHAT: Route[ChatCompletionRequest] = Route(
    "chat.completions", lambda data: validated(ChatCompletionRequest, data), _chat_ask)
COMPLETIONS: Route[CompletionRequest] = Route(
    "completions", lambda data: validated(CompletionRequest, data), _completion_ask)
RESPONSES: Route[ResponsesRequest] = Route(
    "responses", lambda data: validated(ResponsesRequest, data), _responses_ask)
MESSAGES: Route[MessagesRequest] = Route(
    "messages", lambda data: validated(MessagesRequest, data), _messages_ask)
COUNT_TOKENS: Route[CountTokensRequest] = Route(
    "messages.count_tokens", lambda data: validated(CountTokensRequest, data),
    _count_tokens_ask)

TOKENIZE: Route[TokenizeRequest] = Route(
    "tokenize", lambda data: validated(TokenizeRequest, data),
    lambda request: Ask(request.chat_request(), 1, 1))
DETOKENIZE: Route[DetokenizeRequest] = Route(
    "detokenize", lambda data: validated(DetokenizeRequest, data),
    lambda request: Ask(request.chat_request(), 1, 1))

# Every POST route of the router, by path (tests/unit/test_request_checks.py holds the app's
# routes to it).
ROUTES: dict[str, Route[Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/responses": RESPONSES,
    MESSAGES_PATH: MESSAGES,
    COUNT_TOKENS_PATH: COUNT_TOKENS,
    TOKENIZE_PATH: TOKENIZE,
    DETOKENIZE_PATH: DETOKENIZE,
}


def check_seeds(seed: int | None, seeds: int) -> None:
    """Choice i samples with `seed + i`: the last one must still be a seed vLLM takes."""
    if seed is None:
        return
    last = seed + seeds - 1
    if not SEED_MIN <= last <= SEED_MAX:
        raise ApiError(400, f"seed is {seed} and choice {seeds - 1} samples with seed + "
                       f"{seeds - 1} = {last}, outside [{SEED_MIN}, {SEED_MAX}]; lower the seed",
                       param="seed", code="seed_out_of_range")


@contextlib.contextmanager
def checking(field: str | None) -> Iterator[None]:
    """A check of `field` (None: the body as a whole) that fails in a way nobody foresaw is
    still a request the client must change, never a 500: every input to the checks is the
    client's. A 400 naming the field and the exception's type only (no internals); the
    traceback goes to the log, where it is a bug to fix."""
    try:
        yield
    except ApiError:
        raise
    except Exception as exc:
        where = f"'{field}'" if field else "the request body"
        logger.warning("checking %s failed unexpectedly", where, exc_info=True)
        raise ApiError(400, f"{where} could not be checked ({type(exc).__name__}): it holds "
                       "something this server does not accept there", param=field,
                       code="check_failed") from None


def check_ask(ask: Ask, bounds: Bounds) -> int:
    """The limits every route shares, on what its request asks; returns the engine requests
    it may start at once. In this order: counts and sizes (what bounds the schema work, on
    schemas not yet known valid), then every client schema against the JSON Schema
    metaschema, and only then the work counted, which reads into the tools' schemas (the
    sidecar's slots are their properties). Each part runs under the field it reads
    (`checking`)."""
    limits = bounds.limits
    chat = ask.chat
    with checking("messages"):
        check_messages(chat, limits)
        check_arguments(chat, limits)
    with checking("tools"):
        check_tools(chat, limits)
    with checking("stop"):
        check_stop(chat.stop, limits)
    with checking("max_tokens"):
        check_max_tokens(chat, limits, bounds.context)
    if ask.choices > limits.max_choices:
        raise ApiError(400, f"the request asks for {ask.choices} choices; this server returns "
                       f"at most {limits.max_choices} choices per request", param="n",
                       code="too_many_choices")
    check_seeds(chat.seed, ask.seeds)
    with checking("response_format"):
        schema = chat.output_schema
        if schema is not None:
            check_output_schema(schema, limits)
    with checking("tools"):
        for tool in chat.tools or []:
            stop_if_abandoned()  # in the router's pool: refused checks stop between schemas
            problem = check_schema(tool.function.parameters)
            if problem:
                raise ApiError(
                    400,
                    f"tool '{tool.function.name}' has parameters that are not a valid JSON "
                    f"Schema: {problem}",
                    param="tools",
                )
    with checking("tools"):  # every schema is valid now
        work = work_of(chat, ask.choices, limits, bounds.context, bounds.default_max_tokens,
                       bounds.work)
    check_work(work, limits)
    return work.engine_requests


def check_body(route: Route[R], body: bytes, bounds: Bounds) -> Checked[R]:
    """The body of a request to `route`, checked: a `Checked`, or an `ApiError` (4xx), never
    another exception. The body is parsed strictly (app/api/json_body.py) and every string in
    it checked to be encodable before any model or check reads it."""
    with checking(None):
        data = json_object_body(body, bounds.max_body_bytes)
        check_body_depth(data, bounds.limits)
        check_text(data)
        request = route.parse(data)
        ask = route.ask(request)
        return Checked(request, ask, check_ask(ask, bounds))


async def run_checks(route: Route[R], body: bytes, bounds: Bounds, pool: CheckPool | None = None,
                     tenant: str = ANONYMOUS_TENANT) -> Checked[R]:
    """`check_body` in a worker thread under `limits.schema_check_timeout_s` of CPU time and
    `limits.check_max_wait_s` of waiting (a 400 `request_too_complex` past either), so no
    route's checks run on the event loop. With `pool` (the router's), in `tenant`'s share of
    that pool (app/check_pool.py): one tenant's slow checks never take another's threads, an
    identical body of the same tenant is checked once, and refused checks stop at their next
    schema; without, in the loop's default executor."""
    limits = bounds.limits
    what = "checking the request's schemas"
    if pool is None:
        return await off_loop(lambda: check_body(route, body, bounds),
                              limits.schema_check_timeout_s, limits.check_max_wait_s, what)
    key = (route.name, hashlib.sha256(body).digest())
    return await in_pool(pool, tenant, key, lambda: check_body(route, body, bounds),
                         limits.schema_check_timeout_s, limits.check_max_wait_s, what)


def parse_request(
    body: bytes,
    max_bytes: int,
    limits: LimitsConfig | None = None,
    context: int | None = None,
) -> ChatCompletionRequest:
    """A chat request's body checked on this thread (the router runs `run_checks`); `limits`
    default to the config's defaults, `context` to `limits.max_tokens`."""
    limits = limits or LimitsConfig()
    bounds = Bounds(limits, max_bytes, context if context is not None else limits.max_tokens)
    return check_body(CHAT, body, bounds).request
