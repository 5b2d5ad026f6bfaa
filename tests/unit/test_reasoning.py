"""Thinking models: the reasoning split agrees with vLLM's reasoning parsers of the same name,
and the main model offers drafts only once the reasoning has ended."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Mapping
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import AppConfig
from app.drafting.auto_drafts import AutoDrafts
from app.drafting.suffix_index import SuffixIndex
from app.engine.vllm_engine import StepDelta
from app.formats.reasoning import Reasoning
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from app.speculation.canonical import Invocation
from app.speculation.draft_sources import DraftSource
from app.speculation.prediction import PredictedCall, Prediction
from app.speculation.turn import TurnResult


@cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import get_cached_tokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    tok = copy.deepcopy(AutoTokenizer.from_pretrained(resolve_model_path("embedded")))
    # Qwen3 and DeepSeek-R1 tokenizers have these as tokens; vLLM's parsers look them up.
    tok.add_special_tokens({"additional_special_tokens": [
        "<think>", "</think>", "<tool_call>", "</tool_call>"]})
    return get_cached_tokenizer(tok)  # as vLLM's server hands it over: the vocabulary read once


def vllm_split(name: str, text: str, kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Req
    from vllm.reasoning import ReasoningParserManager

    logging.getLogger("vllm").setLevel(logging.ERROR)
    parser = ReasoningParserManager.get_reasoning_parser(name)(
        _tokenizer(), chat_template_kwargs=kwargs)
    request = Req(model="m", messages=[{"role": "user", "content": "hi"}])
    result: tuple[str | None, str | None] = parser.extract_reasoning(text, request)
    return result


PIECES = st.sampled_from(["<think>", "</think>", "\n", "\n\n", "Let me think.", "Paris",
                          '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
                          "<tool_call>", "answer"])


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("thinking", [True, False])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(PIECES, max_size=6))
def test_split_agrees_with_vllm(name: str, thinking: bool, pieces: list[str]) -> None:
    text = "".join(pieces)
    kwargs = {"enable_thinking": thinking}
    reasoning = Reasoning.for_request(name, kwargs)  # type: ignore[arg-type]
    assert reasoning is not None
    assert reasoning.split(text) == vllm_split(name, text, kwargs), text


def test_ended_at_marks_where_the_content_starts() -> None:
    qwen = Reasoning("qwen3")
    assert qwen.ended_at("<think>\nhmm") is None
    assert qwen.ended_at("<think>\nhmm\n</think>\n\n") == len("<think>\nhmm\n</think>")
    assert qwen.ended_at("hmm<tool_call>") == len("hmm")
    assert Reasoning("deepseek_r1").ended_at("hmm<tool_call>") is None
    assert Reasoning("qwen3", thinking=False).ended_at("") == 0


# ----- drafts wait for the reasoning to end ----------------------------------------------
class _Store:
    """Auto mode hands the store a gate (app/drafting/auto_drafts.py) that picks the candidates
    from the text written so far; the tests ask it what it drafts at each point."""

    def __init__(self) -> None:
        self.gate: AutoDrafts | None = None
        self.predicted = asyncio.Event()

    def add_candidates(self, request_id: str, texts: list[str],
                       source: DraftSource = "sidecar",
                       stops: Mapping[str, tuple[int, ...]] | None = None) -> bool:
        raise AssertionError("auto mode drafts through its gate")

    def set_suffix(self, request_id: str, index: SuffixIndex) -> bool:
        return True

    def set_gate(self, request_id: str, gate: AutoDrafts) -> bool:
        self.gate = gate
        hand_in = gate.predicted

        def predicted(texts: list[str], source: DraftSource = "sidecar") -> None:
            hand_in(texts, source)
            self.predicted.set()

        gate.predicted = predicted  # type: ignore[method-assign]
        return True


class _Engine:
    """Streams fixed deltas; records when candidates reach the store."""

    def __init__(self, deltas: list[str]) -> None:
        self.deltas = deltas
        self.store = _Store()
        self.speculation = object()

    async def stream(self, prompt: list[int], sampling: dict[str, Any], speculate: bool,
                     on_start: Any, realign: bool = True,
                     cache_salt: str | None = None,
                     sized: bool = True) -> AsyncIterator[StepDelta]:
        on_start("req-1")
        # The prediction arrives while the model thinks. It is validated on a worker thread,
        # which a busy machine may not run for a while: a fixed sleep made the test flaky.
        await asyncio.wait_for(self.store.predicted.wait(), 60)
        for i, text in enumerate(self.deltas):
            last = i == len(self.deltas) - 1
            yield StepDelta([i], text, last, "stop" if last else None, 0.0)
            await asyncio.sleep(0)  # a pass's turn of the loop, as a real engine; not a wait


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def _run(parser: str | None, deltas: list[str],
               kwargs: dict[str, Any] | None = None) -> tuple[_Engine, TurnResult]:
    config = AppConfig.model_validate({"main": {"engine": {"reasoning_parser": parser}}})
    engine = _Engine(deltas)
    main = MainModelService(config, engine=engine)  # type: ignore[arg-type]
    request = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
        "chat_template_kwargs": kwargs, "ooo_spec": {"history": False}})
    from app.main_model.service import PreparedRequest

    prepared = PreparedRequest(request, [1], {"max_tokens": 64}, "auto",
                               request.tool_dicts(), True)
    prepared.reasoning = Reasoning.for_request(config.main.engine.reasoning_parser, kwargs)

    async def prediction() -> Prediction:
        return Prediction(source="sidecar", candidates=[[PredictedCall(
            name="get_weather", arguments={"city": "Paris"})]])

    return engine, await main.complete(prepared, prediction())


async def test_drafts_start_after_the_thinking_ends() -> None:
    deltas = ["<think>", "\nweather", " tool\n", "</think>", "\n\n", CALL]
    engine, final = await _run("qwen3", deltas)
    gate = engine.store.gate
    assert gate is not None
    prefix = "<think>\nweather tool\n</think>"
    assert gate.candidates("<think>\nweather tool\n") == []  # still thinking
    assert gate.candidates("<think>\nweather <tool") == []
    assert gate.candidates(prefix) == [prefix + CALL]  # the delta that closed the reasoning
    assert gate.candidates(prefix + "\n\n") == [prefix + "\n\n" + CALL]
    assert final.reasoning == "\nweather tool\n"
    assert final.calls == [Invocation(name="get_weather", arguments={"city": "Paris"})]
    assert final.content is None


async def test_without_a_reasoning_parser_drafts_start_at_once() -> None:
    engine, final = await _run(None, [CALL])
    assert engine.store.gate is not None and engine.store.gate.candidates("") == [CALL]
    assert final.reasoning is None


async def test_thinking_switched_off_drafts_start_at_once() -> None:
    engine, final = await _run("qwen3", [CALL], {"enable_thinking": False})
    assert engine.store.gate is not None and engine.store.gate.candidates("") == [CALL]
    assert final.reasoning is None and final.calls


async def test_a_call_inside_unclosed_thoughts_is_never_parsed() -> None:
    engine, final = await _run("deepseek_r1", ["<think>", "maybe " + CALL])
    assert final.calls == [] and final.content is None
    assert final.reasoning == "maybe " + CALL
    assert engine.store.gate is not None
    assert engine.store.gate.candidates("<think>maybe " + CALL) == []
