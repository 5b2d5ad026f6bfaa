"""The sidecar's LoRA adapter (`sidecar.lora`) on the real engine: vLLM's LoRA support (CPU:
punica_cpu) serves it on every sidecar request, `ooo_spec.sidecar_adapter: false` predicts
with the base model, and the main model's output stays token-identical to plain decoding when
it drafts from the adapted sidecar's predictions (the adapter changes the sidecar only).
The same main engine also runs the distillation's collection (`ooo-spec sidecar distill`):
BFCL cases of categories the benchmark does not measure, as plain requests, each committed call
a sample whose pairs are the sidecar's own slot prompts with the values the main model wrote.

The adapter is a seeded random one (PEFT with `init_lora_weights=False`: B is not zero, so
the adapter changes the outputs; a freshly initialised LoRA would not) on the embedded model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.config import AppConfig, SidecarConfig, SidecarLoraConfig
from app.distill.collect import collect, load_cases
from app.distill.pairs import offline_sidecar, render_pairs
from app.engine.embedded_model import resolve_model_path
from app.engine.vllm_engine import USE_ADAPTER, EngineError
from app.formats.structural_tag import engine_tag_model
from app.formats.tool_format import parse_forced
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from app.sidecar.service import SidecarService
from app.speculation.prediction import Prediction
from app.speculation.validation import validate_arguments
from tests.integration.test_lossless import PROMPTS, TOOLS

pytestmark = pytest.mark.integration


def random_adapter(folder: Path, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from app.distill.train import TARGET_MODULES, TrainSettings, adapted_layers

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("embedded"),
                                                dtype=torch.float32)
    # On the top layers only, as `ooo-spec sidecar distill` trains it (vLLM leaves the others).
    layers = adapted_layers(base.config.num_hidden_layers, TrainSettings().layers)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGET_MODULES),
                        init_lora_weights=False, task_type="CAUSAL_LM",
                        layers_to_transform=list(layers), layers_pattern="layers")
    get_peft_model(base, config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> AppConfig:
    adapter = random_adapter(tmp_path_factory.mktemp("adapter"))
    return AppConfig(sidecar=SidecarConfig(lora=SidecarLoraConfig(path=str(adapter), max_rank=8)))


@pytest.fixture(scope="module")
def sidecar(config: AppConfig) -> Iterator[SidecarService]:
    service = SidecarService(config)
    service.start()
    yield service
    service.engine.stop()


@pytest.fixture(scope="module")
def main(config: AppConfig) -> Iterator[MainModelService]:
    service = MainModelService(config)
    service.start()
    yield service
    service.engine.stop()


def request(prompt: str, **ooo_spec: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
        "tool_choice": "required", "temperature": 0, "max_tokens": 96, "ooo_spec": ooo_spec,
    })


async def _greedy(service: SidecarService, prompt: list[int], adapter: bool) -> list[int]:
    USE_ADAPTER.set(adapter)
    result = await service.engine.generate(prompt, {"max_tokens": 16, "temperature": 0.0})
    return result.token_ids


def test_the_adapter_is_served_per_request(sidecar: SidecarService) -> None:
    assert sidecar.engine.lora_request is not None
    prompt = sidecar.slot_prompt(request(PROMPTS[0]))
    adapted = asyncio.run(_greedy(sidecar, prompt, adapter=True))
    base = asyncio.run(_greedy(sidecar, prompt, adapter=False))
    assert adapted != base, "the adapter changed nothing: it is not applied"
    # Per request and repeatable: the base model again, then the adapter again.
    assert asyncio.run(_greedy(sidecar, prompt, adapter=False)) == base
    assert asyncio.run(_greedy(sidecar, prompt, adapter=True)) == adapted


def test_vllm_serves_the_adapter_as_peft_computes_it(sidecar: SidecarService,
                                                    config: AppConfig) -> None:
    """What is trained (PEFT) is what is served (vLLM's LoRA layers): greedy continuations
    of the sidecar's own prompts are the same tokens, with the adapter and without."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert config.sidecar.lora is not None
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("embedded"),
                                                dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, config.sidecar.lora.path).eval()

    def peft_greedy(prompt: list[int]) -> list[int]:
        with torch.no_grad():
            out = peft.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        return list(out[0, len(prompt):].tolist())

    for text in (PROMPTS[0], PROMPTS[2]):
        prompt = sidecar.slot_prompt(request(text))
        served = asyncio.run(_greedy(sidecar, prompt, adapter=True))
        assert served == peft_greedy(prompt)[:len(served)] and served
        plain = asyncio.run(_greedy(sidecar, prompt, adapter=False))
        with peft.disable_adapter():
            assert plain == peft_greedy(prompt)[:len(plain)] and plain
        assert plain != served


def test_adapted_predictions_are_calls_that_fit_their_schema(sidecar: SidecarService) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for adapter in (True, False):
        prediction = asyncio.run(sidecar.predict(request(PROMPTS[2], sidecar_adapter=adapter)))
        assert prediction.error is None and prediction.candidates
        for [call] in prediction.candidates:
            assert validate_arguments(call.arguments, schemas[call.name]) == []


def test_another_adapter_swaps_in_without_reloading_the_model(
    sidecar: SidecarService, config: AppConfig, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What the Sidecar deployment's `reconfigure` does with a new `lora_path`."""
    assert config.sidecar.lora is not None
    prompt = sidecar.slot_prompt(request(PROMPTS[0]))
    first = asyncio.run(_greedy(sidecar, prompt, adapter=True))
    model = sidecar.engine.engine
    other = random_adapter(tmp_path_factory.mktemp("other"), seed=1)
    sidecar.engine.swap_adapter(str(other))
    try:
        assert asyncio.run(_greedy(sidecar, prompt, adapter=True)) != first
        assert sidecar.engine.engine is model, "the engine was rebuilt"
    finally:
        sidecar.engine.swap_adapter(config.sidecar.lora.path)
    assert asyncio.run(_greedy(sidecar, prompt, adapter=True)) == first
    with pytest.raises(EngineError, match="adapter_config.json"):
        sidecar.engine.swap_adapter(str(tmp_path_factory.mktemp("empty")))
    assert asyncio.run(_greedy(sidecar, prompt, adapter=True)) == first


async def _main_tokens(main: MainModelService, sidecar: SidecarService | None, text: str
                       ) -> list[int]:
    chat = request(text, enabled=sidecar is not None)
    if sidecar is None:
        return list((await main.complete(main.prepare(chat))).token_ids)
    # The sidecar's prediction is finished before the main model starts: two vLLM engines in
    # one process must not step at the same time (vLLM's forward context and parallel groups
    # are process-global; the deployments run them in separate replicas).
    prediction = await sidecar.predict(chat)
    assert prediction.error is None and prediction.candidates

    async def ready() -> Prediction:
        return prediction

    final = await main.complete(main.prepare(chat), ready())
    return list(final.token_ids)


@pytest.mark.parametrize("text", [PROMPTS[0], PROMPTS[4]])
def test_main_output_is_token_identical_with_the_adapted_sidecar(
    main: MainModelService, sidecar: SidecarService, text: str
) -> None:
    assert main.engine.lora is None and main.engine.lora_request is None
    plain = asyncio.run(_main_tokens(main, None, text))
    drafted = asyncio.run(_main_tokens(main, sidecar, text))
    assert drafted == plain, f"{text!r}: output differs from plain decoding"


def test_collected_calls_are_the_main_models_and_render_as_slot_pairs(
    main: MainModelService,
) -> None:
    cases = load_cases(["bfcl:parallel", "bfcl:live_simple"], 2)
    samples = asyncio.run(collect(main, cases, concurrency=2))
    assert samples, "no committed call in four cases"
    by_id = {c.id: c for c in cases}
    sidecar = offline_sidecar(AppConfig(), main.engine.tokenizer)
    decode = main.engine.tokenizer.decode
    for sample in samples:
        case = by_id[sample.case_id]
        # What the main model wrote, parsed as the server parses a forced call: in the
        # format's own text where a structural tag constrained it, else the JSON fallback.
        parsed = (main.format.parse(sample.text, case.tools)
                  if engine_tag_model(main.config.main.engine) is not None
                  else parse_forced(sample.text, None)).calls
        assert [(c.name, c.arguments) for c in parsed] == [
            (c.name, c.arguments) for c in sample.calls]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
        call = sample.calls[0]
        assert validate_arguments(call.arguments, schemas[call.name]) == []
        slots = [p for p in render_pairs(sample, sidecar) if p.kind == "slot"]
        assert [p.key for p in slots] == [k for k in schemas[call.name]["properties"]
                                          if k in call.arguments]
        for p in slots:
            assert p.key is not None
            value = json.dumps(call.arguments[p.key], ensure_ascii=False)
            assert decode(p.target_ids).strip().rstrip(",") == value
