"""What else fails at start on the machine, checked as vLLM checks it: a dtype the GPU cannot
run (bf16 below compute capability 8.0, `CudaPlatform.check_if_supports_dtype`), and weights
absent while `HF_HUB_OFFLINE=1` (the pods' setting)."""

from __future__ import annotations

import os
from pathlib import Path

from app.config import EngineConfig
from app.config_check.model_info import local_config_json
from app.config_check.report import DeploymentReport

# Compute capability by the same names (NVIDIA's CUDA GPUs table): bf16 needs 8.0 (Ampere).
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "T4": (7, 5),
    "V100": (7, 0),
    "A10": (8, 6),
    "A10G": (8, 6),
    "L4": (8, 9),
    "L40": (8, 9),
    "L40S": (8, 9),
    "A100": (8, 0),
    "A100-40G": (8, 0),
    "A100-80G": (8, 0),
    "H100": (9, 0),
    "H20": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
}
BF16_MIN_CAPABILITY = (8, 0)


def check_dtype(dep: DeploymentReport, cfg: EngineConfig, setting: str, gpu_type: str) -> None:
    """bf16 needs compute capability 8.0 (vLLM: "Bfloat16 is only supported on GPUs with
    compute capability of at least 8.0"); `auto` falls back to float16 there by itself."""
    capability = COMPUTE_CAPABILITY.get(gpu_type)
    if cfg.dtype == "bfloat16" and capability is not None and capability < BF16_MIN_CAPABILITY:
        version = ".".join(str(part) for part in capability)
        dep.errors.append(
            f"`{setting}.dtype` = bfloat16 needs compute capability 8.0, the {gpu_type} has "
            f"{version}: set `{setting}.dtype` to float16 (or `{setting}.gpu_type` to the GPU "
            "the replicas really run on)"
        )


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` as huggingface_hub reads it (the pods set it: k8s/base/runtime.yaml)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _has_weights(folder: Path) -> bool:
    return folder.is_dir() and any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir())


def missing_weights(model: str, setting: str) -> str | None:
    """Why an engine of `model` would find no weights with the hub offline, naming the
    setting; None when they are there (the embedded model prepared, a folder with weights, or
    the model's snapshot in the Hugging Face cache)."""
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir, is_prepared

    if model == EMBEDDED_MODEL_ALIAS:
        if is_prepared(embedded_model_dir()):
            return None
        return (f"`{setting}.model` is the embedded model, which is not prepared here: run "
                "`ooo-spec models prepare`")
    if Path(model).is_dir():
        if _has_weights(Path(model)):
            return None
        return f"`{setting}.model` = {model!r} is a folder without weights"
    cached = local_config_json(model)
    if cached is not None and _has_weights(cached.parent):
        return None
    return (
        f"`{setting}.model` = {model!r} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 "
        f"forbids downloading it: prefetch it (`hf download {model}`, or build the image with "
        f"PREFETCH_MODELS naming it), or set `{setting}.model` to a folder holding it"
    )
