"""Engine arguments per platform (app/engine/engine_args.py) and the CUDA driver check
(app/engine/cuda_driver.py), without vLLM building anything."""

from __future__ import annotations

import pytest

from app.config import EngineConfig, SpeculationConfig, load_config
from app.engine.cuda_driver import driver_problem, minimum_driver
from app.engine.engine_args import (
    MODEL_RUNNER_ENV,
    PROPOSER_CLASS,
    apply_env,
    cpu_launch,
    cuda_launch,
    custom_proposer_config,
    engine_launch,
)

SPEC = custom_proposer_config(SpeculationConfig(num_speculative_tokens=8))
NGRAM = load_config({}).baselines.ngram.speculative_config()


def gpu_engine(**update: object) -> EngineConfig:
    values: dict[str, object] = {
        "model": "Qwen/Qwen3-8B", "dtype": "bfloat16", "max_model_len": 32768,
        "gpu_memory_utilization": 0.9, "enforce_eager": False,
    }
    values.update(update)
    return EngineConfig.model_validate(values)


# ---------------------------------------------------------------- CUDA


def test_cuda_takes_gpu_memory_utilization_and_no_kv_cache_bytes_by_default() -> None:
    launch = cuda_launch(gpu_engine(), "Qwen/Qwen3-8B", SPEC)
    assert launch.kwargs["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in launch.kwargs
    assert launch.kwargs["speculative_config"] == {
        "method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": 8,
    }
    assert launch.kwargs["enforce_eager"] is False


def test_cuda_pins_the_kv_cache_only_when_the_config_sets_it() -> None:
    launch = cuda_launch(gpu_engine(kv_cache_gib=6), "m")
    assert launch.kwargs["kv_cache_memory_bytes"] == 6 * (1 << 30)


def test_cuda_sets_no_cpu_variables_and_asks_for_the_v1_runner() -> None:
    for spec in (SPEC, NGRAM, None):
        launch = cuda_launch(gpu_engine(cpu_bind="0"), "m", spec)
        names = {*launch.env, *launch.env_defaults, *launch.env_unset}
        assert not [n for n in names if n.startswith("VLLM_CPU_")]
        assert launch.env[MODEL_RUNNER_ENV] == "0"
        assert launch.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_ngram_baseline_gets_the_same_runner_and_one_numba_thread() -> None:
    main = engine_launch("cuda", gpu_engine(), "m", SPEC)
    ngram = engine_launch("cuda", gpu_engine(), "m", NGRAM)
    assert ngram.env[MODEL_RUNNER_ENV] == main.env[MODEL_RUNNER_ENV] == "0"
    assert ngram.env_defaults["NUMBA_NUM_THREADS"] == "1"
    assert "NUMBA_NUM_THREADS" not in main.env_defaults
    assert ngram.kwargs["speculative_config"]["method"] == "ngram"


# ---------------------------------------------------------------- CPU (as before)


def test_cpu_default_keeps_the_half_gib_cache_through_kv_cache_memory_bytes() -> None:
    launch = cpu_launch(EngineConfig(), "/models/smol", SPEC)
    assert launch.kwargs["kv_cache_memory_bytes"] == 512 * (1 << 20)
    assert "gpu_memory_utilization" not in launch.kwargs
    assert launch.env_unset == ("VLLM_CPU_KVCACHE_SPACE",)
    assert launch.env_defaults["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert launch.env[MODEL_RUNNER_ENV] == "0"


def test_cpu_whole_gib_go_through_the_environment() -> None:
    launch = cpu_launch(EngineConfig(kv_cache_gib=2, cpu_bind="0-1"), "m")
    assert "kv_cache_memory_bytes" not in launch.kwargs
    assert launch.env_defaults["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_apply_env_sets_overrides_defaults_and_unsets() -> None:
    launch = cpu_launch(EngineConfig(), "m")
    environ = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_LOGGING_LEVEL": "DEBUG",
               MODEL_RUNNER_ENV: "1"}
    apply_env(launch, environ)
    assert "VLLM_CPU_KVCACHE_SPACE" not in environ
    assert environ["VLLM_LOGGING_LEVEL"] == "DEBUG"  # a default keeps the operator's value
    assert environ[MODEL_RUNNER_ENV] == "0"  # the runner is not the operator's choice
    assert launch.effective_env({"VLLM_LOGGING_LEVEL": "DEBUG"})["VLLM_LOGGING_LEVEL"] == "DEBUG"


# ---------------------------------------------------------------- CUDA driver


@pytest.mark.parametrize(
    ("cuda", "driver"),
    [("12.8", (570, 26)), ("12.9", (575, 51, 3)), ("13.0", (580, 65, 6)),
     ("12.7", (560, 28, 3)), ("12.4.1", (550, 54, 14))],
)
def test_minimum_driver_per_cuda_build(cuda: str, driver: tuple[int, ...]) -> None:
    assert minimum_driver(cuda) == driver


def test_driver_problem_names_the_driver_to_install() -> None:
    assert driver_problem("12.8", "570.133.20") is None
    assert driver_problem("12.8", "570.26") is None
    problem = driver_problem("12.8", "535.183.01")
    assert problem is not None
    assert "535.183.01" in problem and "570.26" in problem and "CUDA 12.8" in problem
    with pytest.raises(ValueError):
        minimum_driver("10.2")


def test_batch_invariant_reaches_the_cuda_engines_environment() -> None:
    from app.engine.engine_args import BATCH_INVARIANT_ENV

    strict = EngineConfig(dtype="bfloat16", batch_invariant=True)
    assert cuda_launch(strict, "m").env[BATCH_INVARIANT_ENV] == "1"
    assert BATCH_INVARIANT_ENV not in cuda_launch(EngineConfig(dtype="bfloat16"), "m").env
