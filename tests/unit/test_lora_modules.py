"""Which layers the sidecar's engine wraps for LoRA (app/engine/lora_modules.py): the adapter's
own, in vLLM's packed names, and a swap that needs more is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config import AppConfig, SidecarLoraConfig
from app.engine.lora_modules import adapter_modules, peft_modules, runtime_modules, uncovered

LLAMA_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                "gate_up_proj": ["gate_proj", "up_proj"]}


BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
         "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def _peft_names(layers: range, modules: tuple[str, ...]) -> list[str]:
    """Weight names as PEFT saves a Llama adapter."""
    return [f"base_model.model.model.layers.{i}.{BLOCK[m]}.{m}.lora_{ab}.weight"
            for i in layers for m in modules for ab in "AB"]


def _adapter(folder: Path, layers: range, modules: tuple[str, ...], rank: int = 8) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    save_file({name: torch.zeros(1) for name in _peft_names(layers, modules)},
              str(folder / "adapter_model.safetensors"))
    return folder


def test_the_adapters_modules_in_vllms_packed_names() -> None:
    names = _peft_names(range(28, 30), ("q_proj", "k_proj", "v_proj", "down_proj"))
    modules = adapter_modules([*names, "base_model.model.lm_head.weight"])
    assert modules == {f"model.layers.{i}.{BLOCK[m]}.{m}" for i in (28, 29)
                       for m in ("q_proj", "k_proj", "v_proj", "down_proj")}
    assert runtime_modules(modules, LLAMA_PACKED) == [
        "model.layers.28.mlp.down_proj", "model.layers.28.self_attn.qkv_proj",
        "model.layers.29.mlp.down_proj", "model.layers.29.self_attn.qkv_proj"]
    # One child of a packed layer wraps the whole packed layer.
    assert runtime_modules({"model.layers.3.mlp.up_proj"}, LLAMA_PACKED) == [
        "model.layers.3.mlp.gate_up_proj"]
    assert runtime_modules({"model.layers.3.mlp.up_proj"}, {}) == ["model.layers.3.mlp.up_proj"]


def test_uncovered_modules() -> None:
    wrapped = ["model.layers.1.self_attn.qkv_proj"]
    assert uncovered(["model.layers.1.self_attn.qkv_proj"], wrapped) == []
    assert uncovered(["model.layers.0.self_attn.qkv_proj"], wrapped) == [
        "model.layers.0.self_attn.qkv_proj"]
    assert uncovered(["anything"], None) == []  # the engine wrapped every layer
    assert uncovered(None, wrapped)  # an adapter whose layers are unknown needs them all


def test_the_launch_restricts_vllms_lora_to_the_given_modules() -> None:
    from app.engine.engine_args import cpu_launch, with_lora

    engine = AppConfig().sidecar.engine
    assert "lora_target_modules" not in with_lora(cpu_launch(engine, "/m"), 16).kwargs
    launch = with_lora(cpu_launch(engine, "/m"), 16, ["model.layers.29.self_attn.qkv_proj"])
    assert launch.kwargs["lora_target_modules"] == ["model.layers.29.self_attn.qkv_proj"]
    # vLLM's own matcher takes a full module name as a target (not only a suffix).
    from vllm.lora.utils import is_in_target_modules

    assert is_in_target_modules("model.layers.29.self_attn.qkv_proj",
                                launch.kwargs["lora_target_modules"], LLAMA_PACKED)
    assert not is_in_target_modules("model.layers.28.self_attn.qkv_proj",
                                    launch.kwargs["lora_target_modules"], LLAMA_PACKED)


def test_the_embedded_models_packing_is_read_from_vllm() -> None:
    from app.engine.embedded_model import embedded_model_dir, is_prepared
    from app.engine.lora_modules import packed_modules_mapping

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (ooo-spec models prepare)")
    assert packed_modules_mapping(str(embedded_model_dir())) == LLAMA_PACKED


def test_a_swap_needing_more_layers_than_the_engine_wraps_is_refused(tmp_path: Path) -> None:
    from app.config_check import sidecar_adapter_errors

    top = _adapter(tmp_path / "top", range(28, 30), ("q_proj", "k_proj", "v_proj"))
    wider = _adapter(tmp_path / "wider", range(20, 30), ("q_proj", "k_proj", "v_proj"))
    fewer = _adapter(tmp_path / "fewer", range(29, 30), ("q_proj",))
    assert peft_modules(str(top)) == {f"model.layers.{i}.self_attn.{m}"
                                      for i in (28, 29) for m in ("q_proj", "k_proj", "v_proj")}
    assert peft_modules(str(tmp_path)) is None
    config = AppConfig.model_validate({"sidecar": {"lora": {"path": str(top)}}})
    assert config.sidecar.lora == SidecarLoraConfig(path=str(top), modules="adapter")
    assert sidecar_adapter_errors(config, {"lora_path": str(fewer)}) == []
    [error] = sidecar_adapter_errors(config, {"lora_path": str(wider)})
    assert "model.layers.20.self_attn" in error and "modules: all" in error
    every = AppConfig.model_validate({"sidecar": {"lora": {"path": str(top), "modules": "all"}}})
    assert sidecar_adapter_errors(every, {"lora_path": str(wider)}) == []
