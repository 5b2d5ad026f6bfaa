"""Memory: the KV cache one `max_model_len` request needs, and what the cache gets on a GPU.

KV cache per token, as vLLM sizes a full-attention layer (`v1/kv_cache_interface.py`):
2 (K and V) x layers x KV heads x head_dim x dtype bytes, in blocks of `block_size` tokens plus
the one null block the block pool holds back (`v1/core/kv_cache_utils.py`). On a GPU the memory
comes from `engine.gpu_type` (or the deployment's `accelerator_type`) via `GPU_MEMORY_MIB`.
What the cache gets on a GPU without `kv_cache_gib` is an estimate: vLLM measures activations
and CUDA graphs at start, this check reserves `GPU_RESERVE_GIB` for them.
"""

from __future__ import annotations

import math

from app.config import EngineConfig, ModelDims
from app.config_check.placement import ActorOptions
from app.config_check.platform_checks import (
    BF16_MIN_CAPABILITY,
    COMPUTE_CAPABILITY,
    check_dtype,
)
from app.config_check.report import DeploymentReport

GIB = 1 << 30


# Total memory per GPU as the driver reports it (nvidia-smi), by Ray's accelerator type names.
GPU_MEMORY_MIB: dict[str, int] = {
    "T4": 15_360,
    "V100": 16_384,
    "A10": 23_028,
    "A10G": 23_028,
    "L4": 23_034,
    "L40": 46_068,
    "L40S": 46_068,
    "A100": 40_960,  # the 40 GB part; name the 80 GB one "A100-80G"
    "A100-40G": 40_960,
    "A100-80G": 81_920,
    "H100": 81_559,
    "H20": 97_871,
    "H200": 143_771,
    "B200": 183_359,
}


# Activations of the profiling run, CUDA graphs and memory outside torch, which vLLM measures
# at start and takes out of `gpu_memory_utilization` before the KV cache: an estimate.
GPU_RESERVE_GIB = 2.5


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_bytes_per_token(dims: ModelDims, dtype_bytes: int) -> int:
    return 2 * dims.num_hidden_layers * dims.num_key_value_heads * dims.head_dim * dtype_bytes


def kv_bytes_for_request(per_token: int, max_model_len: int, block_size: int) -> int:
    """What vLLM requires before it starts: the blocks of one `max_model_len` request, plus
    the null block the block pool holds back."""
    return (math.ceil(max_model_len / block_size) + 1) * block_size * per_token


def gpu_kv_cache(
    dep: DeploymentReport,
    actor: ActorOptions,
    cfg: EngineConfig,
    setting: str,
    dims: ModelDims,
    dtype_bytes: int,
) -> tuple[float, str] | None:
    """(KV cache bytes, where they come from) of a GPU engine; None after an error."""
    gpu_type = cfg.gpu_type or actor.accelerator_type
    dep.gpu_type = gpu_type
    if gpu_type is None or gpu_type not in GPU_MEMORY_MIB:
        known = ", ".join(GPU_MEMORY_MIB)
        what = "no GPU type" if gpu_type is None else f"unknown GPU type {gpu_type!r}"
        dep.errors.append(f"{what}: set `{setting}.gpu_type` to one of {known}")
        return None
    check_dtype(dep, cfg, setting, gpu_type)
    capability = COMPUTE_CAPABILITY.get(gpu_type)
    if cfg.batch_invariant and capability is not None and capability < BF16_MIN_CAPABILITY:
        dep.errors.append(
            f"`{setting}.batch_invariant` needs compute capability 8.0 (vLLM), the {gpu_type} "
            f"has {'.'.join(str(p) for p in capability)}: set it to false"
        )
    # A tensor-parallel engine spreads weights and KV cache over its GPUs.
    gpus = cfg.tensor_parallel_size
    total = GPU_MEMORY_MIB[gpu_type] * (1 << 20)
    dep.gpu_memory_gib = round(total / GIB, 1)
    total *= gpus
    if actor.num_gpus < 1 and cfg.gpu_memory_utilization > actor.num_gpus:
        # vLLM refuses to start when less than utilization x total is free; a replica that
        # shares its GPU is only sure to find its own share free.
        dep.errors.append(
            f"the replica shares its GPU (num_gpus {actor.num_gpus}) but "
            f"`{setting}.gpu_memory_utilization` is {cfg.gpu_memory_utilization}: set it to at "
            f"most {actor.num_gpus} (and pin `{setting}.kv_cache_gib`)"
        )
        return None
    budget = cfg.gpu_memory_utilization * total
    weights = dims.num_parameters * dtype_bytes
    left = budget - weights - gpus * GPU_RESERVE_GIB * GIB
    if cfg.kv_cache_gib is not None:
        cache = cfg.kv_cache_gib * GIB
        if cache > left:
            dep.errors.append(
                f"`{setting}.kv_cache_gib` = {cfg.kv_cache_gib} GiB does not fit beside the "
                f"weights ({weights / GIB:.1f} GiB) and about {GPU_RESERVE_GIB} GiB of "
                f"activations in `{setting}.gpu_memory_utilization` x {gpu_type} "
                f"({budget / GIB:.1f} GiB): lower `{setting}.kv_cache_gib` to at most "
                f"{max(left, 0) / GIB:.1f}"
            )
        return cache, f"{setting}.kv_cache_gib"
    return left, (
        f"{setting}.gpu_memory_utilization {cfg.gpu_memory_utilization} of {gpu_type} less "
        f"weights {weights / GIB:.1f} GiB and ~{GPU_RESERVE_GIB} GiB activations (estimate)"
    )
