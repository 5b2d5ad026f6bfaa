"""`Sidecar` deployment: predicts the tool invocation with its own small engine.

`inject_fault`/`clear_faults` exist for the degradation tests and refuse to work unless the
config enables fault injection (app/faults.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ray import serve

from app import telemetry
from app.api.prefix_index import ROUTE_KEY
from app.config import SidecarUserConfig, load_config
from app.engine.vllm_engine import use_cache_salt
from app.faults import SIDECAR_FAULTS, FaultPlan, garbage_prediction, wrong_prediction
from app.openai_models import ChatCompletionRequest
from app.sidecar.service import SidecarService
from app.speculation.prediction import Prediction
from app.tenancy import ANONYMOUS_TENANT, TENANT_KEY
from deployments.fault_handles import FaultHandles
from deployments.metrics import ServeMetrics


@serve.deployment(name="Sidecar")
class Sidecar(FaultHandles):
    def __init__(self, config: dict[str, Any]) -> None:
        loaded = load_config(config)
        self.service = SidecarService(loaded)
        self.faults = FaultPlan(loaded.faults.enabled, SIDECAR_FAULTS)
        self.record_content = loaded.telemetry.record_content
        self.metrics = ServeMetrics()
        telemetry.setup_tracing("sidecar")
        self.service.start()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's `user_config` (app.config.SidecarUserConfig), applied on a redeploy without
        restarting the replica: `lora_path` swaps the adapter, the model stays loaded."""
        update = SidecarUserConfig.model_validate(user_config)
        if update.lora_path is not None:
            self.service.engine.swap_adapter(update.lora_path)

    async def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._measured_predict(payload)
        finally:  # cancelled ones too: their prompts were prefilled all the same
            telemetry.record_all(self.metrics, telemetry.prefill_measurements(
                *self.service.engine.prefills.take()))

    async def _measured_predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        parent = telemetry.extract(payload.pop(telemetry.CARRIER_KEY, None))
        started = time.perf_counter()
        with telemetry.span("sidecar.predict", parent) as span:
            try:
                result = await self._predict(payload)
            except asyncio.CancelledError:  # the main model finished first: nobody waits
                elapsed = (time.perf_counter() - started) * 1000
                telemetry.set_attributes(span, {"ooo_spec.sidecar.status": "cancelled",
                                                "ooo_spec.sidecar.elapsed_ms": elapsed})
                telemetry.record_all(self.metrics,
                                     telemetry.sidecar_measurements("cancelled", elapsed))
                raise
            try:
                prediction = Prediction.model_validate(result)
            except ValueError:  # a garbage answer (fault injection): nothing to measure
                return result
            telemetry.set_attributes(
                span, telemetry.prediction_attributes(prediction, self.record_content)
            )
        telemetry.record_all(self.metrics, telemetry.sidecar_measurements(
            telemetry.prediction_status(prediction), prediction.elapsed_ms))
        return result

    async def _predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        # This call's own context (Serve runs each call as a task): every engine request the
        # prediction makes shares the tenant's prefix cache and no other's.
        use_cache_salt(str(payload.pop(TENANT_KEY, ANONYMOUS_TENANT)))
        payload.pop(ROUTE_KEY, None)  # the Router's, for its own bookkeeping
        request = ChatCompletionRequest.model_validate(payload)
        fault = self.faults.hit()
        if fault is not None:
            return await self._faulty(fault, request)
        prediction = await self.service.predict(request)
        return prediction.model_dump()

    async def _faulty(self, fault: str, request: ChatCompletionRequest) -> dict[str, Any]:
        if fault == "hang":
            await self.faults.hang()
            raise RuntimeError("injected fault: the sidecar hung")
        if fault == "slow":
            prompt = self.service.prompt(request, request.tool_dicts())
            await self.service.engine.generate(
                prompt, {"max_tokens": 1024, "temperature": 0.0, "ignore_eos": True})
            return (await self.service.predict(request)).model_dump()
        if fault == "error":
            raise RuntimeError("injected fault: the sidecar failed")
        if fault == "garbage":
            return garbage_prediction()
        return wrong_prediction(request.tool_dicts()).model_dump()

    def engine_counters(self) -> dict[str, int]:
        return self.service.engine.counters()

    def check_health(self) -> None:
        if not self.service.engine.healthy:
            raise RuntimeError("sidecar engine step loop is not running")
