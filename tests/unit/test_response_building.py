"""Work around each response, done once and off the main replica's event loop: a request's
choices share one rendering of the prompt (MainModelService.prepare_shared), and the output's
logprobs are gathered in linear time (GenerationTally)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.check_pool import CheckPool
from app.config import AppConfig
from app.engine.vllm_engine import GenerationTally, PrefillTally, StepDelta
from app.formats.logprobs import TokenLogprobs
from app.main_model.service import MainModelService, PreparedRequest
from app.openai_models import ChatCompletionRequest
from tests.unit.fake_engine import FakeEngine

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


# Token ids instead of the chat template (the fake engine has no tokenizer): the rendering is
# shared or not all the same.
PROMPT = [1, 2, 3]


def choices(n: int, seed: int | None) -> list[ChatCompletionRequest]:
    """The requests app.api makes of one request with `n` choices: alike but for the seed."""
    return [ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER], "tool_choice": "required",
        **({"seed": seed + i} if seed is not None else {})}) for i in range(n)]


def service() -> tuple[MainModelService, list[ChatCompletionRequest]]:
    main = MainModelService(AppConfig(), engine=FakeEngine(["x"]))  # type: ignore[arg-type]
    main.prepare_pool = CheckPool(2, 2, "prepare-test")
    prepared: list[ChatCompletionRequest] = []
    plain = main.prepare

    def counting(request: ChatCompletionRequest, *args: Any) -> PreparedRequest:
        prepared.append(request)
        return plain(request, *args)

    main.prepare = counting  # type: ignore[method-assign]
    return main, prepared


async def test_the_choices_of_one_request_share_one_rendering() -> None:
    main, rendered = service()
    requests = choices(8, seed=5)
    out = await asyncio.gather(*(main.prepare_shared(r, PROMPT, tenant="t") for r in requests))
    assert len(rendered) == 1
    assert [p.sampling["seed"] for p in out] == list(range(5, 13))
    assert [p.request for p in out] == requests
    assert len({id(p.prompt_token_ids) for p in out}) == 8  # each its own copy
    assert all(p.prompt_token_ids == out[0].prompt_token_ids for p in out)
    assert all(p.sampling.keys() == out[0].sampling.keys() for p in out)


async def test_without_a_seed_no_choice_gets_one() -> None:
    main, rendered = service()
    out = await asyncio.gather(*(main.prepare_shared(r, PROMPT) for r in choices(3, seed=None)))
    assert len(rendered) == 1 and all("seed" not in p.sampling for p in out)


async def test_different_requests_and_tenants_are_rendered_apart() -> None:
    main, rendered = service()
    other = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": [WEATHER], "tool_choice": "required"})
    [one] = choices(1, seed=None)
    await asyncio.gather(main.prepare_shared(one, PROMPT, tenant="a"),
                         main.prepare_shared(other, PROMPT, tenant="a"),
                         main.prepare_shared(one, PROMPT, tenant="b"))
    assert len(rendered) == 3


def test_the_tally_gathers_logprobs_in_place() -> None:
    """One list extended per delta (a new list per delta made long outputs quadratic)."""
    tally = GenerationTally(3, 0.0)
    deltas = [StepDelta([i], "a", False, None, float(i),
                        logprobs=[TokenLogprobs(i, ((i, -0.5, "a"),))]) for i in range(100)]
    tally.add(deltas[0])
    gathered = tally.logprobs
    for delta in deltas[1:]:
        tally.add(delta)
    assert tally.logprobs is gathered
    assert [t.token_id for t in tally.result().logprobs or []] == list(range(100))


def test_the_tally_keeps_the_prefix_cache_hit_of_the_prompt() -> None:
    """vLLM reports the cached prompt tokens once the prompt is prefilled; deltas without it
    (0) do not take it back."""
    tally = GenerationTally(40, 0.0)
    for cached in (32, 32, 0):
        tally.add(StepDelta([1], "a", False, None, 1.0, cached_tokens=cached))
    assert tally.result().cached_tokens == 32
    assert GenerationTally(40, 0.0).result().cached_tokens == 0


def test_the_prefill_tally_hands_over_what_was_prefilled_since_the_last_take() -> None:
    tally = PrefillTally()
    tally.add(100, 64)
    tally.add(30, 0)
    tally.add(10, 12)  # never more cached than the prompt held
    assert tally.take() == (140, 74)
    assert tally.take() == (0, 0)
