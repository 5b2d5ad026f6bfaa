"""The sidecar: predicts the tool invocation with a small model, beside the main model.

Two modes (config `sidecar.mode`):
- `slots` (default, forced calls): pick the tool, then fill every required argument slot in
  parallel (see `slot_filling.py`) — ready in a fraction of the main model's decode time;
- `whole`: one generation of the whole invocation constrained to the union over the request's
  tools (plus "no call" when the model may answer without a call); also used for `auto` and for
  parallel calls, which slot filling does not predict.
Every prediction parses; the main replica still validates it before drafting from it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from app.api.openai_models import ChatCompletionRequest
from app.config import AppConfig
from app.engine import slot_filling
from app.engine.tool_format import prepare_messages
from app.engine.vllm_engine import VllmEngine
from app.spec.prediction import PredictedCall, Prediction
from app.spec.tool_union import NO_CALL_NAME, invocation_union_schema


class SidecarService:
    def __init__(self, config: AppConfig) -> None:
        self.config = config
        self.engine = VllmEngine(config.sidecar.engine, None)

    def start(self) -> None:
        self.engine.start()

    def prompt(self, request: ChatCompletionRequest, tools: list[dict[str, Any]]) -> list[int]:
        return self.engine.chat_prompt_ids(prepare_messages(request.message_dicts(), tools))

    async def predict(self, request: ChatCompletionRequest) -> Prediction:
        started = time.perf_counter()
        mode = request.effective_tool_choice
        if mode == "none" or not request.tools:
            return Prediction(no_call=True)
        parallel = mode != "named" and request.parallel_tool_calls is True
        if self.config.sidecar.mode == "slots" and mode in ("required", "named") and not parallel:
            try:
                calls = await self.predict_slots(request, mode)
            except Exception as exc:  # the main model decodes on without us
                return Prediction(error=f"{type(exc).__name__}: {exc}",
                                  elapsed_ms=(time.perf_counter() - started) * 1000)
            return Prediction(
                candidates=[calls] if calls else [],
                elapsed_ms=(time.perf_counter() - started) * 1000,
            )
        return await self.predict_whole(request, mode, started)

    async def predict_slots(
        self, request: ChatCompletionRequest, mode: str
    ) -> list[PredictedCall]:
        """Tool first, then all required argument slots at once; [] if a slot failed."""
        # The prompt shows every tool of the request, as the main model's prompt does.
        prompt = self.prompt(request, request.tool_dicts())
        tools = {t.function.name: t.function.parameters for t in request.tools or []}
        encode = self.engine.tokenizer.encode
        if mode == "named" and request.named_tool:
            name = request.named_tool
        elif len(tools) == 1:
            name = next(iter(tools))
            # Prefill the shared prompt once so the slots below find it in the prefix cache;
            # submitted together without this, every slot would prefill it on its own.
            await self.engine.generate(prompt, {"max_tokens": 1, "temperature": 0.0})
        else:
            head = prompt + encode(slot_filling.name_prefix(mode), add_special_tokens=False)
            # Also the prefill of the shared prompt that the slots then take from the cache.
            choice = await self.engine.generate(
                head, {"max_tokens": 32, "temperature": 0.0,
                       "structured_choice": list(tools)}
            )
            name = choice.text.strip()
            if name not in tools:
                return []
        parameters = tools[name]
        keys = slot_filling.slots(parameters)
        budget = self.config.sidecar.slot_max_tokens

        async def fill(key: str) -> Any:
            tail = encode(slot_filling.slot_prefix(mode, name, key), add_special_tokens=False)
            sampling: dict[str, Any] = {"max_tokens": budget, "temperature": 0.0}
            regex = slot_filling.slot_regex(parameters, key)
            if regex is not None:
                sampling["structured_regex"] = regex
            else:
                sampling["structured_json"] = slot_filling.slot_schema(parameters, key)
            result = await self.engine.generate(prompt + tail, sampling)
            return slot_filling.parse_slot_value(result.text)

        values = await asyncio.gather(*(fill(k) for k in keys), return_exceptions=True)
        if any(isinstance(v, BaseException) for v in values):
            return []  # a value cut short by its budget: no candidate beats a broken one
        return [PredictedCall(name=name, arguments=dict(zip(keys, values, strict=True)))]

    async def predict_whole(
        self, request: ChatCompletionRequest, mode: str, started: float
    ) -> Prediction:
        tools = request.tool_dicts()
        if mode == "named":
            tools = [t for t in tools if t["function"]["name"] == request.named_tool]
        try:
            prompt = self.prompt(request, tools)
            schema = invocation_union_schema(
                tools,
                allow_no_call=mode == "auto",
                allow_parallel=mode != "named" and request.parallel_tool_calls is not False,
            )
            budget = self.config.sidecar.max_tokens
            if len(prompt) + budget > self.config.sidecar.engine.max_model_len:
                return Prediction(error="prompt too long for the sidecar's context")
            runs = [
                self.engine.generate(prompt, self._sampling(schema, budget, i))
                for i in range(self.config.sidecar.top_k)
            ]
            results = await asyncio.gather(*runs)
        except Exception as exc:  # the main model decodes on without us
            return Prediction(error=f"{type(exc).__name__}: {exc}",
                              elapsed_ms=(time.perf_counter() - started) * 1000)
        candidates: list[list[PredictedCall]] = []
        no_call = False
        for result in results:
            calls = parse_prediction(result.text)
            if calls is None:
                continue
            if not calls:
                no_call = no_call or not candidates
                continue
            if calls not in candidates:
                candidates.append(calls)
        return Prediction(
            source="sidecar",
            candidates=candidates,
            no_call=no_call and not candidates,
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )

    @staticmethod
    def _sampling(schema: dict[str, Any], max_tokens: int, index: int) -> dict[str, Any]:
        # The first alternative is greedy (the single best guess); the others sample.
        return {
            "max_tokens": max_tokens,
            "temperature": 0.0 if index == 0 else 0.8,
            "seed": index,
            "structured_json": schema,
        }


def parse_prediction(text: str) -> list[PredictedCall] | None:
    """Calls in a sidecar output; [] means "no call"; None means unparseable (cut short)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    items = data if isinstance(data, list) else [data]
    calls: list[PredictedCall] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        if item["name"] == NO_CALL_NAME:
            return []
        args = item.get("arguments")
        calls.append(PredictedCall(name=item["name"], arguments=args if isinstance(args, dict)
                                   else {}))
    return calls
