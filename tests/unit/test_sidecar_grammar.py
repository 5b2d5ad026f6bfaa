"""The sidecar checks its engine requests' grammars as the main replica does
(app.sidecar.service, app.formats.grammar_check): a grammar too slow to compile never reaches its
engine, and the prediction degrades (a slot left out, or no prediction), never a wrong one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import xgrammar as xgr

from app.check_pool import CheckPool
from app.config import AppConfig
from app.engine.vllm_engine import use_cache_salt
from app.formats.grammar_check import GrammarCheck
from app.openai_models import ChatCompletionRequest
from app.sidecar.service import SidecarService
from tests.unit.fake_engine import FakeEngine

VOCAB = [chr(c) for c in range(32, 127)] + ['{"', '":', '",', "ab", "</s>"]
# Bounded repeats: about 0.5 s of CPU per property on this vocabulary as a JSON grammar, far
# past the limit below (which a check reads every 50 ms: quick ones end before it is read).
SLOW_PROPERTY = {"type": "string", "pattern": r"([a-z]{1,9}\.){1,1000}"}


def tool(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


def sidecar(mode: str, pieces: list[str], timeout_s: float) -> SidecarService:
    service = SidecarService(AppConfig.model_validate(
        {"sidecar": {"mode": mode, "verify": False, "predict_optional": False,
                     "refill_repeats": False}}))
    engine = FakeEngine(pieces)
    engine.tokenizer = SimpleNamespace(  # slots mode encodes the call around each slot
        encode=lambda text, add_special_tokens=False: [ord(c) for c in text])
    service.engine = engine  # type: ignore[assignment]
    service.grammar_check = GrammarCheck(
        xgr.TokenizerInfo(VOCAB, stop_token_ids=[len(VOCAB) - 1]), timeout_s, 60,
        CheckPool(2, 1, "sidecar-test"))
    return service


def forced(properties: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "go"}],
        "tools": [tool(properties)], "tool_choice": "required"})


def grammars(engine: Any) -> list[str]:
    return [k for _, sampling in engine.requests for k in sampling if k.startswith("structured")]


async def test_a_slow_union_grammar_never_reaches_the_engine() -> None:
    use_cache_salt("tenant-a")
    service = sidecar("whole", ['{"name": "f", "arguments": {}}'], 0.001)
    slow = {f"p{i}": SLOW_PROPERTY for i in range(2)}
    prediction = await service.predict(forced(slow))
    assert prediction.error is not None and not prediction.candidates
    assert service.engine.requests == []  # type: ignore[attr-defined]


async def test_a_quick_union_grammar_is_checked_once_and_served() -> None:
    use_cache_salt("tenant-a")
    service = sidecar("whole", ['{"name": "f", "arguments": {"a": "x"}}'], 30)
    prediction = await service.predict(forced({"a": {"type": "string"}}))
    assert prediction.error is None and prediction.candidates
    assert grammars(service.engine) and service.grammar_check is not None
    assert [tenant for tenant, _, _ in service.grammar_check._verdicts.items()] == ["tenant-a"]


async def test_a_slow_slot_is_left_out_and_the_quick_one_is_filled() -> None:
    use_cache_salt("tenant-a")
    service = sidecar("slots", ['"x"'], 0.001)
    request = forced({"quick": {"type": "boolean"}, "slow": SLOW_PROPERTY})
    prediction = await service.predict(request)
    assert service.grammar_check is not None
    refused = [text for _, (_, text), fast in service.grammar_check._verdicts.items()
               if not fast]
    assert len(refused) == 1 and "[a-z]" in refused[0]
    # Only the quick slot reached the engine under a grammar; the slow one drafts a placeholder
    # (app.sidecar.slot_filling.draft_calls), which the main model's verification overwrites.
    assert grammars(service.engine) == ["structured_json"] or grammars(service.engine) == [
        "structured_regex"]
    assert prediction.error is None and prediction.candidates
