"""`Sidecar` deployment: predicts the tool invocation with its own small engine."""

from __future__ import annotations

from typing import Any

from ray import serve

from app.api.openai_models import ChatCompletionRequest
from app.config import load_config
from app.engine.sidecar import SidecarService


@serve.deployment(name="Sidecar")
class Sidecar:
    def __init__(self, config: dict[str, Any]) -> None:
        self.service = SidecarService(load_config(config))
        self.service.start()

    async def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = ChatCompletionRequest.model_validate(payload)
        prediction = await self.service.predict(request)
        return prediction.model_dump()

    def check_health(self) -> None:
        if not self.service.engine.healthy:
            raise RuntimeError("sidecar engine step loop is not running")
