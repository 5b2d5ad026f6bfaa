"""`MainModel` deployment: the vLLM main engine with the candidate proposer.

On a turn the router wants the sidecar for, this replica makes the sidecar call itself, beside
its own prefill: Serve's wait for a sidecar replica to take the call (`_to_object_ref`) is then
never on the critical path, and the prediction reaches the very replica that decodes the
request. Decoding never waits for it; the call's `ObjectRef` goes back to the router in the
stream (`SidecarCalled`) as soon as it exists, for pre-execution and the report.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from app import telemetry
from app.api import prefix_index
from app.api.prefix_index import ROUTE_KEY
from app.config import load_config
from app.engine.rejections import engine_rejection
from app.main_model.baselines import baseline_service
from app.main_model.service import MainModelService
from app.main_model.side_result import with_side_result
from app.openai_models import ChatCompletionRequest, OooSpecOptions
from app.speculation.prediction import Prediction
from app.speculation.turn import SidecarCalled, TurnError, TurnEvent, TurnResult
from app.tenancy import ANONYMOUS_TENANT, TENANT_KEY
from deployments.metrics import ServeMetrics


@serve.deployment(name="MainModel")
class MainModel:
    def __init__(self, config: dict[str, Any], baseline: str | None = None,
                 sidecar: DeploymentHandle | None = None) -> None:
        """`baseline` set (e.g. 'ngram'): this replica serves that comparison engine.
        `sidecar`: the Sidecar deployment, called for the turns the router asks it for."""
        loaded = load_config(config)
        self.sidecar = sidecar
        self.sidecar_start_timeout_s = loaded.speculation.sidecar_start_timeout_s
        self.service = (
            baseline_service(loaded, baseline) if baseline else MainModelService(loaded)
        )
        self.record_content = loaded.telemetry.record_content
        self.metrics = ServeMetrics()
        # Reported with each result (`ooo_spec.routing`): where cache-affinity routing sent it.
        self.replica = serve.get_replica_context().replica_id.unique_id
        telemetry.setup_tracing(f"main_{baseline}" if baseline else "main")
        self.service.start()

    async def generate(
        self, payload: dict[str, Any], call_sidecar: bool = False,
        raw_prompt: str | list[int] | None = None,
    ) -> AsyncIterator[TurnEvent | TurnError | SidecarCalled]:
        """`raw_prompt`: /v1/completions (see `MainModelService.prepare`). The turn's events;
        a `TurnError` (the request cannot be served as asked) is yielded, not raised, so that
        it crosses Ray intact: the router raises it again (`deployments/router.py`).
        `call_sidecar`: the router admitted a sidecar call for this turn; it starts here at
        once, and `SidecarCalled` comes as soon as a sidecar replica has it."""
        sidecar = self._start_sidecar(dict(payload)) if call_sidecar else None
        # Not a current span: this generator yields, and the replica finishes it in any task.
        span = telemetry.start_span(
            "main.generate", telemetry.extract(payload.pop(telemetry.CARRIER_KEY, None))
        )
        finished = False
        try:
            events: AsyncIterator[TurnEvent | TurnError | SidecarCalled] = self._generate(
                payload, sidecar, span, raw_prompt)
            if sidecar is not None:
                events = with_side_result(events, sidecar, _SidecarCall.announce)
            async for event in events:
                yield event
            finished = True
        except BaseException as exc:
            telemetry.fail(span, exc)
            raise
        finally:
            span.end()
            if sidecar is not None:
                # The prediction is moot once the turn is over, unless the router awaits it
                # for the report (`diagnostics.await_prediction`): free the sidecar.
                _end_sidecar(sidecar, keep=finished and _awaits_prediction(payload))

    def _start_sidecar(self, payload: dict[str, Any]) -> asyncio.Task[_SidecarCall]:
        """The turn's sidecar call (`payload` as the router sent it), started now."""
        return asyncio.ensure_future(self._sidecar_call(payload))

    async def _sidecar_call(self, payload: dict[str, Any]) -> _SidecarCall:
        route_id = payload.get(ROUTE_KEY)
        if self.sidecar is None:  # a comparison engine, or an app deployed without one
            return _SidecarCall.failed("no sidecar is deployed")
        response: Any = self.sidecar.predict.remote(payload)
        try:
            # Waits only for a replica to take the call: instant unless all are busy or one
            # is restarting. Beside the prefill, so the main model never waits for it.
            ref = await asyncio.wait_for(response._to_object_ref(),
                                         self.sidecar_start_timeout_s)
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:  # TimeoutError, or no sidecar replica at all
            response.cancel()
            return _SidecarCall.failed(
                f"the sidecar did not take the request: {type(exc).__name__}")
        finally:
            if route_id is not None:
                # Not reported: the sidecar's cache is its own (the main call's routing is).
                # Through the module: Serve pickles this class by value, and the log's lock
                # does not pickle.
                prefix_index.ROUTING_LOG.take(str(route_id), "Sidecar")
        return _SidecarCall(ref, response)

    async def _generate(
        self, payload: dict[str, Any], sidecar: asyncio.Task[_SidecarCall] | None,
        span: telemetry.Span, raw_prompt: str | list[int] | None = None,
    ) -> AsyncIterator[TurnEvent | TurnError]:
        tenant = str(payload.pop(TENANT_KEY, ANONYMOUS_TENANT))
        payload.pop(ROUTE_KEY, None)  # the Router's, for its own bookkeeping
        request = ChatCompletionRequest.model_validate(payload)
        try:
            prepared = await self.service.prepare_shared(request, raw_prompt, tenant=tenant)
            await self.service.check_grammar(prepared)
        except TurnError as err:
            yield err
            return
        except Exception as exc:  # the tokenizer or the chat template refusing the request
            refused = engine_rejection(exc)
            if refused is None:
                raise
            yield refused
            return
        candidates = _prediction(sidecar) if sidecar is not None else None
        try:
            async for event in self.service.run(prepared, candidates,
                                                telemetry.context_of(span)):
                if isinstance(event, TurnResult):
                    event = dataclasses.replace(event, replica=self.replica)
                    telemetry.set_attributes(
                        span, telemetry.main_attributes(event, self.record_content)
                    )
                    telemetry.record_all(
                        self.metrics, telemetry.main_measurements(event, prepared.speculate)
                    )
                    telemetry.record_all(self.metrics, telemetry.prefill_measurements(
                        *self.service.engine.prefills.take()))
                yield event
        except Exception as exc:  # vLLM's refusal comes before any event
            refused = engine_rejection(exc)
            if refused is None:
                raise  # the replica's own failure: the router answers 503
            yield refused

    async def count_tokens(self, payload: dict[str, Any]) -> int | TurnError:
        """The prompt tokens of a chat payload as `generate` would render it (POST
        /v1/messages/count_tokens); a `TurnError` (the template refusing it) is returned, not
        raised, so that it crosses Ray intact."""
        tenant = str(payload.pop(TENANT_KEY, ANONYMOUS_TENANT))
        request = ChatCompletionRequest.model_validate(payload)
        return await _refusal_returned(self.service.count_prompt_tokens(request, tenant))

    async def tokens(self, order: dict[str, Any]) -> dict[str, Any] | TurnError:
        """`POST /tokenize` / `/detokenize` (app/api/tokenize.py) on this replica's tokenizer,
        off its event loop; a `TurnError` is returned, not raised, to cross Ray intact."""
        if order["op"] == "detokenize":
            return await _refusal_returned(
                asyncio.to_thread(self.service.detokenize, list(order["tokens"])))
        chat = dict(order["chat"])
        chat.pop(TENANT_KEY, None)
        request = ChatCompletionRequest.model_validate(chat)
        return await _refusal_returned(asyncio.to_thread(
            self.service.tokenize, request, order["prompt"], bool(order["special"]),
            bool(order["strs"])))

    def engine_counters(self) -> dict[str, int]:
        return self.service.engine.counters()

    def check_health(self) -> None:
        if not self.service.engine.healthy:
            raise RuntimeError("main engine step loop is not running")


_T = TypeVar("_T")


async def _refusal_returned(work: Awaitable[_T]) -> _T | TurnError:
    """`work`'s result, or the `TurnError` it raised or the engine's refusal of it (the
    tokenizer or the chat template refusing the request), returned, not raised, so that it
    crosses Ray intact."""
    try:
        return await work
    except TurnError as err:
        return err
    except Exception as exc:
        refused = engine_rejection(exc)
        if refused is None:
            raise
        return refused


@dataclasses.dataclass(frozen=True)
class _SidecarCall:
    """A turn's sidecar call: `ref`, the `ObjectRef` of its `Prediction` dict; `response`, the
    Serve call to cancel (None: none was made, and `ref` holds a failed `Prediction`)."""

    ref: Any
    response: Any = None

    @staticmethod
    def failed(error: str) -> _SidecarCall:
        # The main model reads it like an answer; the router reports it (sidecar_error).
        return _SidecarCall(ray.put(Prediction(error=error).model_dump()))

    def announce(self) -> SidecarCalled:
        return SidecarCalled(self.ref)


async def _prediction(call: asyncio.Task[_SidecarCall]) -> Prediction:
    value = await (await asyncio.shield(call)).ref
    return Prediction.model_validate(value)


def _end_sidecar(call: asyncio.Task[_SidecarCall], keep: bool) -> None:
    """Stop the sidecar's work (`keep`: the router still awaits the prediction)."""
    if not call.done():
        call.cancel()  # still waiting for a replica: the task cancels the Serve call
        return
    if keep or call.cancelled() or call.exception() is not None:
        return
    response = call.result().response
    if response is not None:
        response.cancel()


def _awaits_prediction(payload: dict[str, Any]) -> bool:
    """Whether the router awaits the sidecar's prediction after the main call
    (`ooo_spec.diagnostics.await_prediction`); only the options are read again, not the
    request's messages and tools."""
    options = OooSpecOptions.model_validate(payload.get("ooo_spec") or {})
    return options.diagnostics.await_prediction
