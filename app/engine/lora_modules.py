"""Which of the sidecar model's layers vLLM wraps for LoRA: the adapter's own, not all of them.

vLLM wraps every supported linear layer for LoRA when the engine is built, whatever layers the
adapter covers, and each wrapped layer runs punica's kernels on every token. On CPU those
kernels are plain torch ops, so a 30-layer model pays for 30 layers of LoRA (about 60% more
time per sidecar pass, measured in docs/benchmarks.md) even when the adapter trained by
`ooo-spec sidecar distill` sits on the top 8 only. vLLM's `lora_target_modules` takes full
module names as well as suffixes, so the engine is built with the names of the modules the
adapter has weights for, in vLLM's own naming: PEFT writes `q_proj`, `k_proj`, `v_proj`, where
vLLM's model has one packed `qkv_proj` (the model class's `packed_modules_mapping`).

Pure functions first (unit-tested); `adapter_runtime_modules` reads the files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# PEFT's safetensors keys: `base_model.model.<module>.lora_A.weight`.
_PEFT_PREFIX = "base_model.model."
_PEFT_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A",
                  ".lora_embedding_B", ".lora_magnitude_vector")


def adapter_modules(weight_names: Iterable[str]) -> set[str]:
    """The model's module names an adapter has LoRA weights for, from its weight names."""
    modules: set[str] = set()
    for name in weight_names:
        for suffix in _PEFT_SUFFIXES:
            if name.endswith(suffix):
                modules.add(name.removeprefix(_PEFT_PREFIX).removesuffix(suffix))
                break
    return modules


def runtime_modules(
    modules: Iterable[str], packed: Mapping[str, Sequence[str]]
) -> list[str]:
    """The modules as vLLM's model names them: a module that vLLM packs with its siblings
    (`q_proj` into `qkv_proj`) becomes the packed one, so the whole packed layer is wrapped."""
    parent_of = {child: parent for parent, children in packed.items() for child in children}
    out: set[str] = set()
    for module in modules:
        head, _, suffix = module.rpartition(".")
        parent = parent_of.get(suffix)
        out.add(f"{head}.{parent}" if parent and head else module)
    return sorted(out)


def uncovered(needed: Iterable[str] | None, wrapped: Sequence[str] | None) -> list[str]:
    """The modules of `needed` (None: unknown, so every one) the engine did not wrap
    (`wrapped` None: it wrapped every one)."""
    if wrapped is None:
        return []
    if needed is None:
        return ["(the adapter's layers are unknown: no adapter_model.safetensors)"]
    have = set(wrapped)
    return sorted(m for m in needed if m not in have)


def peft_modules(adapter: str) -> set[str] | None:
    """The modules the adapter in folder `adapter` (PEFT's format) has weights for; None when
    its weights are not in safetensors (an older PEFT's `adapter_model.bin`)."""
    from safetensors import safe_open

    weights_file = Path(adapter) / "adapter_model.safetensors"
    if not weights_file.is_file():
        return None
    with safe_open(str(weights_file), "pt") as weights:
        return adapter_modules(weights.keys())


def adapter_runtime_modules(adapter: str, model_path: str) -> list[str] | None:
    """The vLLM module names the adapter in folder `adapter` needs wrapped on the model at
    `model_path` (an engine with vLLM importable); None: unknown, wrap every one."""
    modules = peft_modules(adapter)
    if modules is None:
        return None
    return runtime_modules(modules, packed_modules_mapping(model_path))


def packed_modules_mapping(model_path: str) -> dict[str, list[str]]:
    """vLLM's packing of the model's layers (its model class's `packed_modules_mapping`)."""
    from vllm.model_executor.models import ModelRegistry

    config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    for architecture in config.get("architectures") or []:
        model_class = ModelRegistry._try_load_model_cls(architecture)
        if model_class is not None:
            return {k: list(v) for k, v in
                    (getattr(model_class, "packed_modules_mapping", None) or {}).items()}
    return {}
