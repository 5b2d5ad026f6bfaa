"""vLLM's sampling and routing extras (issue 42, item 3): accepted with vLLM's bounds on chat
completions and completions, mapped onto vLLM's `SamplingParams`, and the fields vLLM's
speculative decoding does not apply decode without drafts, with the reason reported."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pydantic import ValidationError

from app.api.completions import CompletionRequest
from app.api.prefix_index import SESSION_WEIGHT, prompt_key
from app.config import AppConfig
from app.main_model.service import MainModelService, prefix_cache_salt
from app.openai_models import ChatCompletionRequest
from app.speculation.turn import TurnError
from tests.unit.fake_engine import FakeEngine

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

EVERY_FIELD: dict[str, Any] = {
    "top_k": 5, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
    "repetition_penalty": 1.2, "logit_bias": {"42": 150.0, "7": -3}, "stop_token_ids": [2],
    "ignore_eos": True, "min_tokens": 3, "bad_words": ["Paris"],
}


def chat(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
        "ooo_spec": {"history": False}, **extra})


def service(**config: Any) -> MainModelService:
    return MainModelService(AppConfig.model_validate(config),
                            engine=FakeEngine([]))  # type: ignore[arg-type]


def test_every_sampling_field_reaches_vllms_sampling_params() -> None:
    sampling = service().prepare(chat(**EVERY_FIELD), raw_prompt=[1, 2, 3]).sampling
    expected = {**EVERY_FIELD, "logit_bias": {42: 100.0, 7: -3.0}}  # clamped as vLLM does
    assert {k: sampling[k] for k in expected} == expected
    # Every key is one vLLM's SamplingParams takes, under that name.
    from vllm import SamplingParams

    assert set(EVERY_FIELD) <= set(inspect.signature(SamplingParams.from_optional).parameters)


def test_completions_take_the_same_fields_onto_their_chat_request() -> None:
    request = CompletionRequest.model_validate({"prompt": "Hi", **EVERY_FIELD,
                                                "session_id": "s", "cache_salt": "x"})
    carried = request.chat_request(0)
    assert carried.engine_sampling() == chat(**EVERY_FIELD).engine_sampling()
    assert (carried.session_id, carried.cache_salt) == ("s", "x")
    with pytest.raises(ValidationError, match="reasoning_effort"):
        CompletionRequest.model_validate({"prompt": "Hi", "reasoning_effort": "low"})


@pytest.mark.parametrize("field, value", [
    ("top_k", -2), ("top_k", 1.5), ("min_p", 1.5), ("min_p", -0.1),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
    ("logit_bias", {"x": 1}), ("logit_bias", {"-1": 1}), ("stop_token_ids", [-1]),
    ("min_tokens", -1), ("bad_words", [""]), ("reasoning_effort", "huge"),
    ("cache_salt", ""), ("cache_salt", "a/b"), ("cache_salt", "a@b"), ("cache_salt", "x" * 129),
    ("priority", 2**63), ("session_id", ""),
])
def test_out_of_bounds_values_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        chat(**{field: value})
    with pytest.raises(ValidationError, match=field):
        CompletionRequest.model_validate({"prompt": "Hi", field: value})


def test_fields_speculation_keeps_leave_drafts_on() -> None:
    kept = {k: v for k, v in EVERY_FIELD.items() if k not in ("min_p", "logit_bias")}
    request = chat(**kept)
    assert request.draft_free_reason() is None
    assert service().prepare(request, raw_prompt=[1, 2, 3]).speculate


@pytest.mark.parametrize("field, value", [("min_p", 0.1), ("logit_bias", {"5": 2.0})])
def test_min_p_and_logit_bias_decode_without_drafts_and_say_why(field: str, value: Any) -> None:
    request = chat(**{field: value})
    reason = request.draft_free_reason()
    assert reason is not None and field in reason
    assert not service().prepare(request, raw_prompt=[1, 2, 3]).speculate
    assert chat(**{field: 0 if field == "min_p" else {}}).draft_free_reason() is None


def test_reasoning_effort_is_the_templates_thinking_switch() -> None:
    assert chat(reasoning_effort="high").chat_template_kwargs == {
        "reasoning_effort": "high", "enable_thinking": True}
    assert chat(reasoning_effort="none").chat_template_kwargs == {
        "reasoning_effort": "none", "enable_thinking": False}
    # The request's own switch wins, as in vLLM.
    assert chat(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False}
                ).chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}


def test_priority_needs_the_priority_policy() -> None:
    with pytest.raises(TurnError, match="scheduling_policy") as refused:
        service().prepare(chat(priority=-1), raw_prompt=[1])
    assert refused.value.param == "priority"
    assert "priority" not in service().prepare(chat(priority=0), raw_prompt=[1]).sampling
    prepared = service(main={"engine": {"scheduling_policy": "priority"}}).prepare(
        chat(priority=-1), raw_prompt=[1])
    assert prepared.sampling["priority"] == -1


def test_a_client_salt_splits_its_tenants_cache_and_never_reaches_another() -> None:
    assert prefix_cache_salt("tenant-a", None) == "tenant-a"
    salts = {prefix_cache_salt(t, s) for t in ("tenant-a", "tenant-b") for s in (None, "x", "y")}
    assert len(salts) == 6  # no (tenant, salt) pair shares another's salt
    assert prefix_cache_salt("tenant-a", "x").startswith("tenant-a@")


def test_session_keys_route_within_the_tenant() -> None:
    one = prompt_key("t", [], [{"role": "user", "content": "a"}], session="s")
    other = prompt_key("t", [], [{"role": "user", "content": "b"}], session="s")
    assert one.hashes[0] == other.hashes[0] and one.lengths[0] == SESSION_WEIGHT
    assert prompt_key("u", [], [], session="s").hashes[0] != one.hashes[0]  # tenant-bound
    plain = prompt_key("t", [], [{"role": "user", "content": "a"}])
    assert plain.hashes[0] != one.hashes[0]


def test_vllms_speculative_refusals_are_the_ones_we_route_around() -> None:
    """Guards the reading of vLLM this module rests on: with speculative decoding vLLM refuses
    exactly min_p and logit_bias, and its rejection sampler applies penalties, bad words and
    min_tokens to drafted rows. A vLLM upgrade that changes either fails here."""
    from vllm import SamplingParams
    from vllm.v1.sample import rejection_sampler

    refusal = inspect.getsource(SamplingParams._validate_spec_decode)
    assert "self.min_p" in refusal and "self.logit_bias" in refusal
    for other in EVERY_FIELD.keys() - {"min_p", "logit_bias"}:
        assert f"self.{other}" not in refusal, other
    sampler = inspect.getsource(rejection_sampler.RejectionSampler.apply_logits_processors)
    for applied in ("apply_penalties", "apply_bad_words_with_drafts", "MinTokensLogitsProcessor"):
        assert applied in sampler, applied
    assert "top_k" in inspect.getsource(rejection_sampler.apply_sampling_constraints)


def test_top_k_over_zero_drafted_rows_no_longer_kills_the_engine() -> None:
    """vLLM 0.32's CPU top-k fails on zero drafted rows (a step without drafts still runs the
    rejection sampler), which killed the step loop for every request: the guard returns such
    logits untouched and leaves every other call to vLLM."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only

    from app.engine.vllm_engine import guard_empty_draft_rows

    empty = torch.empty(0, 8)
    with pytest.raises(RuntimeError):  # vLLM's bug, still there: the guard is still needed
        apply_top_k_only(empty, torch.empty(0, dtype=torch.long))
    original = rejection_sampler.apply_sampling_constraints
    try:
        assert guard_empty_draft_rows() and guard_empty_draft_rows()  # idempotent
        guarded = rejection_sampler.apply_sampling_constraints
        assert guarded(empty, torch.zeros(1, dtype=torch.int32), None) is empty
        greedy = SimpleNamespace(all_greedy=True)
        rows = torch.ones(2, 8)
        assert guarded(rows, torch.tensor([2], dtype=torch.int32), greedy) is rows
    finally:
        rejection_sampler.apply_sampling_constraints = original


def test_the_pytorch_expansion_is_vllms() -> None:
    import torch

    from app.engine.vllm_engine import expand_batch_to_tokens

    x = torch.tensor([0.0, 0.7, 1.3])
    out = expand_batch_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6,
                                 replace_from=0, replace_to=1)
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])
    k = expand_batch_to_tokens(torch.tensor([5, 3]), torch.tensor([0, 2]), 2)
    assert k.tolist() == [3, 3]  # a request without drafted rows takes none
