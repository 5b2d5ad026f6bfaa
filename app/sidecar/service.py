"""The sidecar: predicts the tool invocation with a small model, beside the main model.

Two modes (config `sidecar.mode`):
- `slots` (default, forced calls): the tool is chosen first when there is a choice (its name
  written under the names' grammar, as the main model writes it, stopped once only one name
  fits; after `sidecar.choice_prompt`), then every argument of that tool is filled in
  parallel (see `slot_filling.py`), from a short signature prompt (`sidecar.prompt`) of the
  offered tools or of the chosen one alone (`sidecar.slot_tools`); an
  argument whose value repeats an earlier one's (`sidecar.refill_repeats`), or every argument
  (`sidecar.waves` > 1), is filled again after the values found before it; one token after
  the required values decides whether the call with the optional keys leads
  (`sidecar.predict_optional`); with `sidecar.verify`, one more drafted pass over the call
  they make;
- `whole`: one generation of the whole invocation constrained to the union over the request's
  tools (plus "no call" when the model may answer without a call); also used for `auto` and for
  parallel calls, which slot filling does not predict.
Every prediction parses; the main replica still validates it before drafting from it.

Every grammar the sidecar's engine requests carry (union, slots, names, verify) is compiled
first in the replica's check pool under the same CPU-time limit as the main replica's forced
calls (app/formats/grammar_check.py): a schema too slow to compile is not sent to the engine,
whose own grammar compiles would queue everyone's behind it; that slot (or the prediction)
is left out, which only means less drafting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from app.config import AppConfig
from app.engine.pass_ledger import count_passes
from app.engine.vllm_engine import CACHE_SALT, USE_ADAPTER, GenerationResult, VllmEngine
from app.formats.grammar_check import GrammarCheck, engine_grammar_check
from app.formats.tool_format import (
    ParsedCall,
    forced_output_schema,
    parse_forced,
    prepare_messages,
    render_forced_variants,
    with_system_text,
)
from app.openai_models import ChatCompletionRequest
from app.sidecar import slot_filling
from app.speculation.prediction import PredictedCall, Prediction
from app.speculation.tool_union import NO_CALL_NAME, invocation_union_schema
from app.tenancy import ANONYMOUS_TENANT

logger = logging.getLogger(__name__)


class SidecarService:
    def __init__(self, config: AppConfig) -> None:
        self.config = config
        # With the candidate proposer: the verifying pass over a call is drafted from its slots.
        self.engine = VllmEngine(config.sidecar.engine, config.speculation,
                                 lora=config.sidecar.lora)
        self.grammar_check: GrammarCheck | None = None  # built by start()

    def start(self) -> None:
        self.engine.start()
        self.grammar_check = engine_grammar_check(self.engine, self.config.limits, "sidecar")

    async def check_grammar(self, sampling: dict[str, Any]) -> None:
        """The grammar of an engine request, compiled within the limit in the check pool under
        the caller's tenant (the prefix-cache salt the deployment set for this prediction);
        `GrammarTooSlow` otherwise."""
        if self.grammar_check is not None:
            await self.grammar_check.check_sampling(sampling,
                                                    CACHE_SALT.get() or ANONYMOUS_TENANT)

    async def generate(self, prompt: list[int], sampling: dict[str, Any],
                       **options: Any) -> GenerationResult:
        """`engine.generate` once the request's grammar, if any, passed `check_grammar`."""
        await self.check_grammar(sampling)
        return await self.engine.generate(prompt, sampling, **options)

    def prompt(self, request: ChatCompletionRequest, tools: list[dict[str, Any]]) -> list[int]:
        return self.engine.chat_prompt_ids(prepare_messages(request.message_dicts(), tools))

    def slot_prompt(self, request: ChatCompletionRequest, chosen: str | None = None) -> list[int]:
        """Slots mode's prompt: every tool of the request (the main model sees them all too),
        or, once the tool is `chosen`, that tool alone under `sidecar.slot_tools: chosen`; as
        signatures or as the main model's own listing (`sidecar.prompt`)."""
        tools = request.tool_dicts()
        if chosen is not None and self.config.sidecar.slot_tools == "chosen":
            tools = [t for t in tools if t["function"]["name"] == chosen]
        if self.config.sidecar.prompt == "full":
            return self.prompt(request, tools)
        messages = prepare_messages(request.message_dicts(), None)
        return self.engine.chat_prompt_ids(
            with_system_text(messages, slot_filling.signature_prompt(tools))
        )

    def choice_head(
        self, request: ChatCompletionRequest, mode: str, slot_prompt: list[int]
    ) -> list[int]:
        """What the tool's name is generated after: the choice's prompt
        (`sidecar.choice_prompt`) and the call up to the name's opening quote."""
        listing = self.config.sidecar.choice_prompt
        prompt = slot_prompt
        if listing != "signatures":
            tools = request.tool_dicts()
            prompt = self.prompt(request,
                                 slot_filling.names_only(tools) if listing == "names" else tools)
        encode = self.engine.tokenizer.encode
        return prompt + list(encode(slot_filling.name_prefix(mode), add_special_tokens=False))

    async def predict(self, request: ChatCompletionRequest) -> Prediction:
        """The prediction, with the time and the forward passes its own engine requests were
        in (`Prediction.passes`; other requests' passes meanwhile are not counted)."""
        started = time.perf_counter()
        with count_passes() as passes:
            prediction = await self._predict(request)
        prediction.elapsed_ms = (time.perf_counter() - started) * 1000
        prediction.passes = len(passes)
        return prediction

    async def _predict(self, request: ChatCompletionRequest) -> Prediction:
        # This request's engine requests (and the tasks they spawn) with the adapter or not.
        USE_ADAPTER.set(request.ooo_spec.diagnostics.sidecar_adapter)
        mode = request.effective_tool_choice
        if mode == "none" or not request.tools:
            return Prediction(no_call=True)
        parallel = mode != "named" and request.parallel_tool_calls is True
        if self.config.sidecar.mode == "slots" and mode in ("required", "named") and not parallel:
            verify = request.ooo_spec.diagnostics.verify_prediction
            try:
                alternatives = await self.predict_slots(
                    request, mode, self.config.sidecar.verify if verify is None else verify
                )
            except Exception as exc:  # the main model decodes on without us
                logger.warning("slot prediction failed: %s: %s", type(exc).__name__, exc)
                return Prediction(error=f"the prediction failed ({type(exc).__name__})")
            return Prediction(candidates=alternatives)
        return await self.predict_whole(request, mode)

    async def predict_slots(
        self, request: ChatCompletionRequest, mode: str, verify: bool
    ) -> list[list[PredictedCall]]:
        """The tool first (when there is a choice), then every argument slot of it at once;
        the alternatives are its call with the required keys only and with every filled key.
        `verify`: one more pass over the whole call drafted from them instead (see `verify`)."""
        prompt = self.slot_prompt(request)
        tools = request.tool_schemas()
        names = [request.named_tool] if mode == "named" and request.named_tool else list(tools)
        name = names[0]
        if len(names) > 1:
            head = self.choice_head(request, mode, prompt)
            # Under another prompt than the slots', the slots' prompt prefills beside the
            # choice (one batch on the engine); under `slot_tools: chosen` it needs the name.
            choice = asyncio.ensure_future(self._choose(head, names))
            if head[: len(prompt)] != prompt and self.config.sidecar.slot_tools == "offered":
                await asyncio.gather(
                    choice, self.engine.generate(prompt, {"max_tokens": 1, "temperature": 0.0})
                )
            name = await choice
        if self.config.sidecar.slot_tools == "chosen":  # else the prompt above is the slots'
            prompt = self.slot_prompt(request, name)
        parameters = tools[name] or {}
        keys = slot_filling.slots(parameters)
        if len(keys) > self.config.limits.max_sidecar_slots:
            return []  # one engine request per slot: past the cap, no prediction at all
        tails = {k: self._slot_tail(mode, name, parameters, k) for k in keys}
        # Prefill the prompt and the part of the call every slot shares (up to the first key)
        # once, so each slot below finds it in the prefix cache and computes only its key and
        # the rest of the last cache block; submitted together without this, every slot would
        # prefill the whole prompt on its own.
        shared = slot_filling.common_prefix_len(list(tails.values())) if tails else 0
        await self.engine.generate(
            prompt + (next(iter(tails.values()))[:shared] if tails else []),
            {"max_tokens": 1, "temperature": 0.0},
        )
        values = await self._fill_all(prompt, parameters, tails)
        if self.config.sidecar.refill_repeats:
            # A value equal to an earlier argument's is most often copied from it (the second
            # of two numbers): that argument again, after the values before it.
            repeats = slot_filling.repeated(keys, values)
            if repeats:
                values |= await self._refill(prompt, mode, name, parameters, values, repeats)
        for _ in range(self.config.sidecar.waves - 1):
            values |= await self._refill(prompt, mode, name, parameters, values, keys)
        more = (await self.writes_optional(prompt, mode, name, parameters, values)
                if self.config.sidecar.predict_optional else None)
        drafts = slot_filling.draft_calls(name, parameters, values, optional_first=bool(more))
        if verify:
            verified = await self.verify(prompt, request, mode, name, drafts)
            if verified:
                return [verified]
        return [[d] for d in drafts]

    async def writes_optional(
        self, prompt: list[int], mode: str, name: str, parameters: dict[str, Any],
        values: dict[str, Any],
    ) -> bool | None:
        """Whether the call goes on after its required values (one token after them, the
        prompt mostly in the prefix cache already); None where there is no such point."""
        text = slot_filling.required_prefix(mode, name, parameters, values)
        if text is None:
            return None
        tail = self.engine.tokenizer.encode(text, add_special_tokens=False)
        result = await self.generate(
            prompt + list(tail),
            {"max_tokens": 1, "temperature": 0.0,
             "structured_regex": slot_filling.AFTER_VALUE_REGEX},
        )
        return slot_filling.goes_on(result.text)

    async def _refill(
        self,
        prompt: list[int],
        mode: str,
        name: str,
        parameters: dict[str, Any],
        values: dict[str, Any],
        again: list[str],
    ) -> dict[str, Any]:
        """The arguments `again`, each after the required values found before it in schema
        order (a value often depends on the ones the model wrote first)."""
        tails = {}
        for k in again:
            before = slot_filling.written_before(parameters, values, k)
            if before:
                tails[k] = self._slot_tail(mode, name, parameters, k, before)
        return await self._fill_all(prompt, parameters, tails) if tails else {}

    async def _fill_all(
        self, prompt: list[int], parameters: dict[str, Any], tails: dict[str, list[int]]
    ) -> dict[str, Any]:
        """Every slot in `tails` at once; the ones that did not fill are left out."""
        values = await asyncio.gather(
            *(self.fill(prompt + tail, parameters, k) for k, tail in tails.items()),
            return_exceptions=True,
        )
        return {k: v for k, v in zip(tails, values, strict=True)
                if not isinstance(v, BaseException)}

    def _slot_tail(
        self,
        mode: str,
        name: str,
        parameters: dict[str, Any],
        key: str,
        before: dict[str, Any] | None = None,
    ) -> list[int]:
        """Tokens of the call up to argument `key`'s value, in the main model's style."""
        space = slot_filling.slot_regex(parameters, key) is not None
        text = slot_filling.slot_prefix(mode, name, key, space=space, before=before)
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def fill(self, prompt: list[int], parameters: dict[str, Any], key: str) -> Any:
        """One argument's value after `prompt` (which ends at it), under its own grammar."""
        regex = slot_filling.slot_regex(parameters, key)
        sampling: dict[str, Any] = {
            "max_tokens": self.config.sidecar.slot_max_tokens, "temperature": 0.0
        }
        if regex is not None:
            sampling["structured_regex"] = regex
        else:
            sampling["structured_json"] = slot_filling.slot_schema(parameters, key)
        result = await self.generate(prompt, sampling)
        return slot_filling.parse_slot_value(result.text, separated=regex is not None)

    async def verify(
        self,
        prompt: list[int],
        request: ChatCompletionRequest,
        mode: str,
        name: str,
        drafts: list[PredictedCall],
    ) -> list[PredictedCall]:
        """The sidecar model's own greedy call of tool `name`, drafted from the slot values the
        way the main model is drafted: where a value depends on the others (the second of two
        numbers, a sign) or an optional key comes or not, the verifying pass writes its own
        and picks the draft up again at the next key. A right draft takes a few passes."""
        offered = [t for t in request.tool_dicts() if t["function"]["name"] == name]
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

        result = await self.generate(prompt, sampling, speculate=True, on_start=give)
        if result.finish_reason == "length":
            return []
        try:
            calls = parse_forced(result.text, named).calls
        except (json.JSONDecodeError, KeyError, TypeError):
            return []
        return [PredictedCall(name=c.name, arguments=c.arguments) for c in calls]

    async def _choose(self, head: list[int], names: list[str]) -> str:
        """`choose` with the base model unless the adapter is meant for the choice too
        (`sidecar.lora.tool_choice`). Run as a task of its own: the setting
        stays in the task's copy of the context, and the slots keep the adapter."""
        lora = self.config.sidecar.lora
        USE_ADAPTER.set(USE_ADAPTER.get() and (lora is None or lora.tool_choice))
        return await self.choose(head, names)

    async def choose(self, head: list[int], names: list[str]) -> str:
        """The tool the model names after `head` (which ends at the name's opening quote),
        generated greedily under the grammar of the names as the main model's forced call
        writes it; stopped as soon as the text written fits one name only."""
        sampling = {
            "max_tokens": self.config.sidecar.slot_max_tokens,
            "temperature": 0.0,
            "structured_regex": slot_filling.names_regex(names),
        }
        text = ""
        await self.check_grammar(sampling)
        stream = self.engine.stream(head, sampling)
        try:
            async for delta in stream:
                text += delta.text
                left = slot_filling.names_left(names, text)
                if len(left) == 1:
                    return left[0]
                if delta.finished:
                    break
        finally:
            await stream.aclose()  # aborts the request if it is still running
        raise RuntimeError(f"the tool name did not resolve: {text!r}")

    async def predict_whole(self, request: ChatCompletionRequest, mode: str) -> Prediction:
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
            # The alternatives share one grammar: checked once (the check pool shares it too).
            await self.check_grammar(self._sampling(schema, budget, 0))
            runs = [
                self.engine.generate(prompt, self._sampling(schema, budget, i))
                for i in range(self.config.sidecar.top_k)
            ]
            results = await asyncio.gather(*runs)
        except Exception as exc:  # the main model decodes on without us
            logger.warning("whole prediction failed: %s: %s", type(exc).__name__, exc)
            return Prediction(error=f"{type(exc).__name__}: {exc}")
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
