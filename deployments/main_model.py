"""`MainModel` deployment: the vLLM main engine with the candidate proposer.

The router passes the sidecar's answer as an `ObjectRef` inside a list (so Ray does not resolve
it before the call starts); this replica awaits it beside decoding, so the candidate reaches the
very replica that decodes the request, and decoding never waits for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from app.api.errors import ApiError
from app.api.openai_models import ChatCompletionRequest
from app.config import load_config
from app.engine.baselines import baseline_service
from app.engine.main_model import MainModelService
from app.spec.prediction import Prediction


@serve.deployment(name="MainModel")
class MainModel:
    def __init__(self, config: dict[str, Any], baseline: str | None = None) -> None:
        """`baseline` set (e.g. 'ngram'): this replica serves that comparison engine."""
        loaded = load_config(config)
        self.service = (
            baseline_service(loaded, baseline) if baseline else MainModelService(loaded)
        )
        self.service.start()

    async def generate(
        self, payload: dict[str, Any], candidate_refs: list[Any]
    ) -> AsyncIterator[dict[str, Any]]:
        request = ChatCompletionRequest.model_validate(payload)
        try:
            prepared = self.service.prepare(request)
        except ApiError as err:
            yield {"type": "error", "status": err.status, "message": err.message,
                   "param": err.param, "code": err.code}
            return
        candidates = _prediction(candidate_refs[0]) if candidate_refs else None
        async for event in self.service.run(prepared, candidates):
            yield event

    def engine_counters(self) -> dict[str, int]:
        return {"unfinished": self.service.engine.num_unfinished(),
                "store": len(self.service.engine.store)}

    def check_health(self) -> None:
        if not self.service.engine.healthy:
            raise RuntimeError("main engine step loop is not running")


async def _prediction(ref: Any) -> Prediction:
    value = await ref
    return Prediction.model_validate(value)
