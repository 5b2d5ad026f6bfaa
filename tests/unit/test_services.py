"""MainModelService and SidecarService against a fake engine (tests/unit/fake_engine.py):
the turn contract (TurnDelta/TurnResult/TurnError) and the sidecar's prediction, in seconds."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from app.config import AppConfig
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from app.sidecar.service import SidecarService
from app.speculation.canonical import Invocation
from app.speculation.prediction import PredictedCall, Prediction
from app.speculation.turn import TurnDelta, TurnError, TurnResult
from tests.unit.fake_engine import FakeEngine

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS = [PredictedCall(name="get_weather", arguments={"city": "Paris"})]


def chat(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
        "ooo_spec": {"history": False}, **extra})


def main_service(engine: FakeEngine, **config: Any) -> MainModelService:
    return MainModelService(AppConfig.model_validate(config), engine=engine)  # type: ignore[arg-type]


async def drafts_arrived(engine: FakeEngine) -> None:
    """The forced modes' drafts reached the store, or (`tool_choice: auto`) the request's gate
    has candidates for an output that has not started yet."""
    async def wait() -> None:
        while not engine.store.added and not any(
                gate.candidates("") for _, gate in engine.store.gates):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(wait(), 60)  # a bound on waiting only


async def run(service: MainModelService, request: ChatCompletionRequest,
              prediction: Any = None) -> tuple[list[TurnDelta], TurnResult]:
    # A raw prompt: the fake engine has no tokenizer to render the chat template with.
    prepared = service.prepare(request, raw_prompt=[1, 2, 3])
    prepared.raw_prompt = False  # parsed and reported as a chat turn
    events = [e async for e in service.run(prepared, prediction)]
    *deltas, result = events
    assert all(isinstance(d, TurnDelta) for d in deltas) and isinstance(result, TurnResult)
    return deltas, result  # type: ignore[return-value]


async def test_a_turn_yields_deltas_then_a_typed_result_with_the_sidecar_report() -> None:
    engine = FakeEngine([CALL[:30], CALL[30:]], gate=drafts_arrived)
    service = main_service(engine, speculation={"schema_drafts": False})

    async def prediction() -> Prediction:
        return Prediction(candidates=[PARIS], elapsed_ms=12.0)

    deltas, result = await run(service, chat(), prediction())
    assert [d.text for d in deltas] == [CALL[:30], CALL[30:]]
    assert result.calls == [Invocation(name="get_weather", arguments={"city": "Paris"})]
    assert result.content is None and result.text == CALL
    assert (result.prompt_tokens, result.completion_tokens, result.token_ids) == (3, 2, [100, 101])
    assert (result.main.steps, result.main.completion_tokens) == (2, 2)
    assert result.finish_reason == "stop"
    assert result.sidecar.status == "received" and result.sidecar.elapsed_ms == 12.0
    [report] = result.candidates
    assert (report.source, report.name, report.valid) == ("sidecar", "get_weather", True)
    # `tool_choice: auto`: the validated candidate reached the request's gate (registered under
    # the engine's id of the request), which drafts it from the first token.
    [(request_id, gate)] = engine.store.gates
    assert request_id == "req-0" and any(CALL in t for t in gate.candidates(""))


def test_an_invalid_candidate_is_reported_and_never_drafted() -> None:
    service = main_service(FakeEngine([]))
    prepared = service.prepare(chat(), raw_prompt=[1, 2, 3])
    wrong = Prediction(candidates=[[PredictedCall(name="get_weather", arguments={})], PARIS])
    intake, rendered = service.intake(prepared, wrong, 0.0)
    assert [r.valid for r in intake.reports] == [False, True]
    assert rendered and all('"city": "Paris"' in t for t in rendered)


async def test_a_sidecar_that_never_answers_is_late_and_one_that_fails_is_an_error() -> None:
    never: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
    _, late = await run(main_service(FakeEngine([CALL])), chat(), never)
    assert late.sidecar.status == "late" and late.calls and late.candidates == []

    async def broken() -> Prediction:
        raise RuntimeError("sidecar down")

    async def settle(engine: FakeEngine) -> None:
        # Decoding starts once the sidecar's failure has landed in the request's feed.
        async def landed() -> None:
            while engine.feeds[-1].intake.status == "pending":
                await asyncio.sleep(0)
        await asyncio.wait_for(landed(), 60)  # a bound on waiting only

    _, failed = await run(main_service(FakeEngine([CALL], gate=settle)), chat(), broken())
    assert failed.sidecar.status == "error" and "sidecar down" in (failed.sidecar.error or "")
    assert failed.calls  # plain decoding went on


async def test_without_a_sidecar_the_status_is_none() -> None:
    _, result = await run(main_service(FakeEngine(["Hello", " there"])), chat())
    assert result.sidecar.status == "none" and result.calls == []
    assert result.content == "Hello there"


def test_a_prompt_longer_than_the_context_is_a_turn_error() -> None:
    service = main_service(FakeEngine([]))
    limit = service.config.main.engine.max_model_len
    with pytest.raises(TurnError) as err:
        service.prepare(chat(), raw_prompt=[1] * limit)
    assert err.value.code == "context_length_exceeded" and err.value.param == "prompt"


def test_a_turn_error_survives_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(TurnError("too long", param="messages", code="c")))
    assert (err.message, err.param, err.code) == ("too long", "messages", "c")


# ----- the sidecar ---------------------------------------------------------------------------
def sidecar(text: str, fail: Exception | None = None) -> SidecarService:
    service = SidecarService(AppConfig.model_validate({"sidecar": {"mode": "whole"}}))
    service.engine = FakeEngine([text], fail=fail)  # type: ignore[assignment]
    return service


async def test_the_sidecar_parses_its_engines_output_into_a_prediction() -> None:
    out = await sidecar('{"name": "get_weather", "arguments": {"city": "Paris"}}').predict(chat())
    assert out.candidates == [PARIS] and not out.no_call and out.error is None
    assert out.passes == 1  # the passes its engine request wrote in: one piece, one pass
    assert out.elapsed_ms > 0


async def test_a_predictions_passes_are_its_own_not_the_engines() -> None:
    """Another tenant's request decoding on the same engine meanwhile adds passes to the
    engine, never to the prediction: its passes say nothing about others' work."""
    service = sidecar("")
    engine = service.engine
    engine.pieces = ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}']
    out, other = await asyncio.gather(service.predict(chat()), engine.generate([9], {}))
    assert out.candidates == [PARIS] and other.steps == 2
    assert engine.passes == 4  # both requests' pieces, interleaved
    assert out.passes == 2  # the prediction's own two


async def test_the_sidecar_reports_no_call_cut_short_and_failure() -> None:
    none = await sidecar('{"name": "__none__", "arguments": {}}').predict(chat())
    assert none.no_call and none.candidates == []
    cut = await sidecar('{"name": "get_wea').predict(chat())
    assert cut.candidates == [] and not cut.no_call and cut.error is None
    failed = await sidecar("", fail=RuntimeError("engine died")).predict(chat())
    assert failed.error is not None and "engine died" in failed.error
    assert failed.elapsed_ms > 0  # a failure reports the time it took too


async def test_the_sidecar_has_nothing_to_say_without_tools() -> None:
    out = await sidecar("unused").predict(chat(tool_choice="none"))
    assert out.no_call and out.candidates == [] and out.passes == 0


class AdapterRecordingEngine(FakeEngine):
    """Records, per engine request, whether it carries the adapter (`USE_ADAPTER`), its
    grammar and its prompt; every distinct chat is its own one-token prompt."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(pieces)
        self.tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens=False: [7] * 3)
        self.adapter: list[tuple[bool, str | None]] = []
        self.prompts: list[list[int]] = []
        self.chats: list[str] = []

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        chat = json.dumps(messages)
        if chat not in self.chats:
            self.chats.append(chat)
        return [1000 + self.chats.index(chat)]

    def stream(self, prompt_token_ids: list[int], sampling: dict[str, Any],
               *args: Any, **kwargs: Any) -> Any:
        from app.engine.vllm_engine import USE_ADAPTER

        self.adapter.append((USE_ADAPTER.get(), sampling.get("structured_regex")))
        self.prompts.append(prompt_token_ids)
        return super().stream(prompt_token_ids, sampling, *args, **kwargs)


async def predict_between_two_tools(
    sidecar_config: dict[str, Any],
) -> tuple[SidecarService, AdapterRecordingEngine, ChatCompletionRequest, str]:
    """A prediction of the sidecar of `sidecar_config` on a request offering get_weather and
    get_time, the recording engine choosing get_weather; and the names' grammar."""
    from app.sidecar.slot_filling import names_regex

    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}
    service = SidecarService(AppConfig.model_validate({"sidecar": sidecar_config}))
    engine = AdapterRecordingEngine(['get_weather"'])
    service.engine = engine  # type: ignore[assignment]
    request = chat(tools=[WEATHER, other], tool_choice="required")
    prediction = await service.predict(request)
    assert prediction.candidates and prediction.candidates[0][0].name == "get_weather"
    return service, engine, request, names_regex(["get_weather", "get_time"])


@pytest.mark.parametrize("choice_prompt", ["signatures", "names", "full"])
@pytest.mark.parametrize("tool_choice", [False, True])
async def test_the_tool_choice_uses_the_adapter_only_when_configured(
    tool_choice: bool, choice_prompt: str
) -> None:
    service, engine, request, regex = await predict_between_two_tools({
        "choice_prompt": choice_prompt, "lora": {"path": "adapter", "tool_choice": tool_choice}})
    [choice] = [i for i, (_, pattern) in enumerate(engine.adapter) if pattern == regex]
    assert engine.adapter[choice][0] is tool_choice
    # The choice under the main model's own prompt (whole, or its tools' names only) or
    # under the slots' one; with its own prompt, the slots' prompt is prefilled beside it,
    # with the adapter the slots use.
    from app.sidecar.slot_filling import names_only

    slot_prompt = service.slot_prompt(request)
    tools = request.tool_dicts()
    prompts = {"signatures": slot_prompt, "names": service.prompt(request, names_only(tools)),
               "full": service.prompt(request, tools)}
    assert len({tuple(p) for p in prompts.values()}) == 3  # three different chats
    assert engine.prompts[choice][:1] == prompts[choice_prompt]
    assert (engine.prompts.count(slot_prompt) == 1) is (choice_prompt != "signatures")
    assert all(used for i, (used, _) in enumerate(engine.adapter) if i != choice)  # the slots


@pytest.mark.parametrize("slot_tools", ["offered", "chosen"])
async def test_the_slots_prompt_lists_the_offered_tools_or_the_chosen_one(slot_tools: str) -> None:
    service, engine, request, regex = await predict_between_two_tools(
        {"choice_prompt": "names", "slot_tools": slot_tools})
    # Every request after the choice (the shared prefill, the slots, the optional-keys step)
    # starts with the slots' prompt.
    after_choice = [p for p, (_, pattern) in zip(engine.prompts, engine.adapter, strict=True)
                    if pattern != regex and len(p) > 1]
    offered = service.slot_prompt(request)
    alone = service.slot_prompt(chat(tools=[WEATHER], tool_choice="required"))
    assert offered != alone
    assert after_choice and {p[0] for p in after_choice} == {
        (offered if slot_tools == "offered" else alone)[0]}
    # Offered: prefilled beside the choice. Chosen: that listing is never sent.
    assert (offered in engine.prompts) is (slot_tools == "offered")
