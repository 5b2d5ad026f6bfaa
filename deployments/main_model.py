"""`MainModel` deployment: the vLLM main engine with the candidate proposer.

The router passes the sidecar's answer as an `ObjectRef` inside a list (so Ray does not resolve
it before the call starts); this replica awaits it beside decoding, so the candidate reaches the
very replica that decodes the request, and decoding never waits for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from ray import serve

from app import telemetry
from app.api.prefix_index import ROUTE_KEY
from app.config import load_config
from app.engine.rejections import engine_rejection
from app.main_model.baselines import baseline_service
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from app.speculation.prediction import Prediction
from app.speculation.turn import TurnError, TurnEvent, TurnResult
from app.tenancy import ANONYMOUS_TENANT, TENANT_KEY
from deployments.metrics import ServeMetrics


@serve.deployment(name="MainModel")
class MainModel:
    def __init__(self, config: dict[str, Any], baseline: str | None = None) -> None:
        """`baseline` set (e.g. 'ngram'): this replica serves that comparison engine."""
        loaded = load_config(config)
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
        self, payload: dict[str, Any], candidate_refs: list[Any],
        raw_prompt: str | list[int] | None = None,
    ) -> AsyncIterator[TurnEvent | TurnError]:
        """`raw_prompt`: /v1/completions (see `MainModelService.prepare`). The turn's events;
        a `TurnError` (the request cannot be served as asked) is yielded, not raised, so that
        it crosses Ray intact: the router raises it again (`deployments/router.py`)."""
        # Not a current span: this generator yields, and the replica finishes it in any task.
        span = telemetry.start_span(
            "main.generate", telemetry.extract(payload.pop(telemetry.CARRIER_KEY, None))
        )
        try:
            async for event in self._generate(payload, candidate_refs, span, raw_prompt):
                yield event
        except BaseException as exc:
            telemetry.fail(span, exc)
            raise
        finally:
            span.end()

    async def _generate(
        self, payload: dict[str, Any], candidate_refs: list[Any], span: telemetry.Span,
        raw_prompt: str | list[int] | None = None,
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
        candidates = _prediction(candidate_refs[0]) if candidate_refs else None
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


async def _prediction(ref: Any) -> Prediction:
    value = await ref
    return Prediction.model_validate(value)
