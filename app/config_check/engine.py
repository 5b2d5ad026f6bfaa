"""Engine arguments: which `EngineArgs` and environment a deployment's vLLM engine gets
(`app/engine/engine_args.py`, the functions the replica itself calls), with the model, memory
and platform checks of that engine."""

from __future__ import annotations

import math
from typing import Any

from app.config import EngineConfig, Platform
from app.config_check.memory import (
    DTYPE_BYTES,
    GIB,
    gpu_kv_cache,
    kv_bytes_for_request,
    kv_bytes_per_token,
)
from app.config_check.model_info import check_max_model_len, model_dims
from app.config_check.placement import ActorOptions
from app.config_check.platform_checks import hub_offline, missing_weights
from app.config_check.report import DeploymentReport, KvCacheReport
from app.engine.engine_args import DEFAULT_BLOCK_SIZE, cpu_kv_cache_gib, engine_launch


def _platform(actor: ActorOptions) -> Platform:
    # A replica that reserved GPUs runs on CUDA. One that reserved none is placed (pool
    # resources) on CPU nodes, where NVML, which decides the platform like vLLM
    # (cuda_driver.detect_platform), sees no GPU; on a GPU node it would take CUDA with no
    # device visible to it, so engine deployments there reserve their GPUs.
    return "cuda" if actor.num_gpus > 0 else "cpu"


def _model_path_for_display(model: str) -> str:
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir

    return str(embedded_model_dir()) if model == EMBEDDED_MODEL_ALIAS else model


def check_engine(
    dep: DeploymentReport,
    actor: ActorOptions,
    cfg: EngineConfig,
    setting: str,
    speculative: dict[str, Any] | None,
) -> None:
    """Fill `dep` with the engine's arguments and environment and the KV cache check."""
    platform = _platform(actor)
    dep.platform = platform
    dep.model = cfg.model
    launch = engine_launch(platform, cfg, _model_path_for_display(cfg.model), speculative)
    dep.engine_args = launch.kwargs
    dep.speculative_config = launch.kwargs.get("speculative_config")
    dep.env = launch.effective_env({})
    dep.env_unset = list(launch.env_unset)
    if hub_offline():
        missing = missing_weights(cfg.model, setting)
        if missing is not None:
            dep.errors.append(missing)
    check_max_model_len(dep, cfg, setting)
    if cfg.batch_invariant and platform != "cuda":
        dep.errors.append(
            f"`{setting}.batch_invariant` is vLLM's CUDA mode; on CPU a float32 engine's output "
            f"is already identical to plain decoding's: set `{setting}.batch_invariant` to false"
        )
    found = model_dims(cfg)
    if found is None:
        dep.errors.append(
            f"unknown model {cfg.model!r}: its config.json is not local and it is not in the "
            f"table of known models; set `{setting}.model_dims`"
        )
        return
    dims, dims_from, checkpoint_dtype = found
    dep.model_dims, dep.model_dims_from = dims.model_dump(), dims_from
    dtype = cfg.dtype if cfg.dtype != "auto" else (checkpoint_dtype or "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    per_token = kv_bytes_per_token(dims, dtype_bytes)
    block = cfg.block_size or DEFAULT_BLOCK_SIZE[platform]
    needed = kv_bytes_for_request(per_token, cfg.max_model_len, block)
    if platform == "cpu":
        gib = cpu_kv_cache_gib(cfg)
        cache = (round(gib) if gib >= 1 else gib) * GIB
        cache_from = f"{setting}.kv_cache_gib" + ("" if cfg.kv_cache_gib else " (CPU default)")
    else:
        gpu_cache = gpu_kv_cache(dep, actor, cfg, setting, dims, dtype_bytes)
        if gpu_cache is None:
            return
        cache, cache_from = gpu_cache
    fits = cache >= needed
    dep.kv_cache = KvCacheReport(
        bytes_per_token=per_token, block_size=block, request_gib=needed / GIB,
        cache_gib=max(cache, 0) / GIB, cache_from=cache_from, fits=fits,
        full_length_requests=max(cache, 0) / needed,
    )
    if not fits:
        if platform == "cuda" and cfg.kv_cache_gib is None:
            fix = (f"raise `{setting}.gpu_memory_utilization` (or give it a larger GPU), "
                   f"or lower `{setting}.max_model_len`")
        else:
            fix = (f"raise `{setting}.kv_cache_gib` to at least {math.ceil(needed / GIB * 10) / 10}"
                   f", or lower `{setting}.max_model_len`")
        dep.errors.append(
            f"the KV cache ({cache / GIB:.2f} GiB from {cache_from}) cannot hold one request of "
            f"`{setting}.max_model_len` = {cfg.max_model_len} tokens ({needed / GIB:.2f} GiB at "
            f"{per_token} bytes per token), so vLLM refuses to start: {fix}"
        )
