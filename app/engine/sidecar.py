"""The sidecar: predicts the tool invocation with a small model, beside the main model.

Two modes (config `sidecar.mode`):
- `slots` (default, forced calls): fill every argument slot in parallel while the tool is
  chosen (see `slot_filling.py`); with `sidecar.verify`, one more drafted pass over the call
  they make;
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
from app.engine.tool_format import (
    ParsedCall,
    forced_output_schema,
    parse_forced,
    prepare_messages,
    render_forced_variants,
)
from app.engine.vllm_engine import VllmEngine
from app.spec.prediction import PredictedCall, Prediction
from app.spec.tool_union import NO_CALL_NAME, invocation_union_schema


class SidecarService:
    def __init__(self, config: AppConfig) -> None:
        self.config = config
        # With the candidate proposer: the verifying pass over a call is drafted from its slots.
        self.engine = VllmEngine(config.sidecar.engine, config.speculation)

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
            verify = request.ooo_spec.verify_prediction
            try:
                alternatives = await self.predict_slots(
                    request, mode, self.config.sidecar.verify if verify is None else verify
                )
            except Exception as exc:  # the main model decodes on without us
                return Prediction(error=f"{type(exc).__name__}: {exc}",
                                  elapsed_ms=(time.perf_counter() - started) * 1000)
            return Prediction(
                candidates=alternatives, elapsed_ms=(time.perf_counter() - started) * 1000
            )
        return await self.predict_whole(request, mode, started)

    async def predict_slots(
        self, request: ChatCompletionRequest, mode: str, verify: bool
    ) -> list[list[PredictedCall]]:
        """Every argument slot at once (of every tool, when they fit in one batch) while the
        tool is chosen; the alternatives are the chosen tool's call with the required keys only
        and with every filled key. `verify`: one more pass over the whole call drafted from
        them instead (see `verify`)."""
        # The prompt shows every tool of the request, as the main model's prompt does.
        prompt = self.prompt(request, request.tool_dicts())
        tools = {t.function.name: t.function.parameters for t in request.tools or []}
        names = [request.named_tool] if mode == "named" and request.named_tool else list(tools)
        # Prefill the shared prompt once so every request below finds it in the prefix cache;
        # submitted together without this, every slot would prefill it on its own.
        await self.engine.generate(prompt, {"max_tokens": 1, "temperature": 0.0})
        choice: asyncio.Future[int] | None = None
        if len(names) > 1:
            options = [f'{n}"' for n in names]
            choice = asyncio.ensure_future(
                self.choose(prompt, slot_filling.name_prefix(mode), options)
            )
        try:
            total = sum(len(slot_filling.slots(tools[n])) for n in names)
            if choice is not None and total >= self.config.sidecar.engine.max_num_seqs:
                names = [names[await choice]]  # too many slots for one batch: the tool first
                choice = None
            keys = [(n, k) for n in names for k in slot_filling.slots(tools[n])]
            values = await asyncio.gather(
                *(self.fill(prompt, mode, n, tools[n], k) for n, k in keys),
                return_exceptions=True,
            )
            filled = {key: v for key, v in zip(keys, values, strict=True)
                      if not isinstance(v, BaseException)}
            drafts = slot_filling.draft_calls(names, tools, filled)
            if verify and drafts:
                verified = await self.verify(prompt, request, mode, names, drafts)
                if verified:
                    return [verified]
            name = names[await choice] if choice is not None else names[0]
        finally:
            if choice is not None:
                choice.cancel()
        return [[d] for d in drafts if d.name == name]

    async def fill(
        self, prompt: list[int], mode: str, name: str, parameters: dict[str, Any], key: str
    ) -> Any:
        """One argument's value, generated under that argument's own grammar."""
        encode = self.engine.tokenizer.encode
        regex = slot_filling.slot_regex(parameters, key)
        prefix = slot_filling.slot_prefix(mode, name, key, space=regex is not None)
        tail = encode(prefix, add_special_tokens=False)
        sampling: dict[str, Any] = {
            "max_tokens": self.config.sidecar.slot_max_tokens, "temperature": 0.0
        }
        if regex is not None:
            sampling["structured_regex"] = regex
        else:
            sampling["structured_json"] = slot_filling.slot_schema(parameters, key)
        result = await self.engine.generate(prompt + tail, sampling)
        return slot_filling.parse_slot_value(result.text, separated=regex is not None)

    async def verify(
        self,
        prompt: list[int],
        request: ChatCompletionRequest,
        mode: str,
        names: list[str],
        drafts: list[PredictedCall],
    ) -> list[PredictedCall]:
        """The sidecar model's own greedy call among `names`, drafted from the slot values the
        way the main model is drafted: where a value depends on the others (the second of two
        numbers, a sign) or an optional key comes or not, the verifying pass writes its own
        and picks the draft up again at the next key. A right draft takes a few passes."""
        offered = [t for t in request.tool_dicts() if t["function"]["name"] in names]
        named = request.named_tool if mode == "named" else None
        texts: list[str] = []
        for draft in drafts:
            texts += render_forced_variants(
                [ParsedCall(draft.name, dict(draft.arguments))], offered, named
            )
        sampling = {
            "max_tokens": self.config.sidecar.max_tokens,
            "temperature": 0.0,
            "structured_json": forced_output_schema(offered, named),
        }

        def give(request_id: str) -> None:
            self.engine.store.add_candidates(request_id, texts)

        result = await self.engine.generate(prompt, sampling, speculate=True, on_start=give)
        if result.finish_reason == "length":
            return []
        try:
            calls = parse_forced(result.text, named).calls
        except (json.JSONDecodeError, KeyError, TypeError):
            return []
        return [PredictedCall(name=c.name, arguments=c.arguments) for c in calls]

    async def choose(self, prompt: list[int], prefix: str, options: list[str]) -> int:
        """Which continuation of `prefix` the model takes, greedily: at each token where the
        remaining options part, the one whose token is likeliest (one forward pass each)."""
        encode = self.engine.tokenizer.encode
        sequences = [encode(prefix + option, add_special_tokens=False) for option in options]
        alive = list(range(len(options)))
        while len(alive) > 1:
            depth = slot_filling.common_prefix_len([sequences[i] for i in alive])
            ended = [i for i in alive if len(sequences[i]) == depth]
            if ended:
                return ended[0]  # an option that is a prefix of another: take the shorter
            branch = sorted({sequences[i][depth] for i in alive})
            scores = await self.engine.next_token_logprobs(
                prompt + sequences[alive[0]][:depth], branch
            )
            best = max(branch, key=lambda t: scores[t])
            alive = [i for i in alive if sequences[i][depth] == best]
        return alive[0]

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
