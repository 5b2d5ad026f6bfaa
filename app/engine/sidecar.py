"""The sidecar: predicts the whole tool invocation with a small model, in one short
constrained generation (the 'whole-JSON' sidecar).

The output is constrained to the union over the request's tools (plus "no call" when the
model may answer without a call), so every prediction parses; the main replica still validates
it against the tool's schema before drafting from it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from app.api.openai_models import ChatCompletionRequest
from app.config import AppConfig
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
        messages = prepare_messages(request.message_dicts(), tools)
        text = self.engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def predict(self, request: ChatCompletionRequest) -> Prediction:
        started = time.perf_counter()
        mode = request.effective_tool_choice
        tools = request.tool_dicts()
        if mode == "named":
            tools = [t for t in tools if t["function"]["name"] == request.named_tool]
        if mode == "none" or not tools:
            return Prediction(no_call=True)
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
