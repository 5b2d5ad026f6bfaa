"""Engine arguments per platform (app/engine/engine_args.py) and the CUDA driver check
(app/engine/cuda_driver.py), without vLLM building anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import EngineConfig, SpeculationConfig, load_config
from app.engine.cuda_driver import driver_check, driver_problem, minimum_driver
from app.engine.engine_args import (
    MODEL_RUNNER_ENV,
    PROPOSER_CLASS,
    apply_env,
    cpu_launch,
    cuda_launch,
    custom_proposer_config,
    engine_launch,
    intra_op_threads,
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


def test_an_unbound_cpu_engine_takes_rays_thread_count() -> None:
    unbound = cpu_launch(EngineConfig(), "m")
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": "1"}) == 1
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": "3"}) == 3
    assert intra_op_threads(unbound, {}) is None  # outside Ray: torch's own default
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": " 2 "}) == 2
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": "0"}) is None
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": "two"}) is None
    # vLLM binds the threads itself: from the config, or from an operator's variable.
    bound = cpu_launch(EngineConfig(cpu_bind="0-1"), "m")
    assert intra_op_threads(bound, {"OMP_NUM_THREADS": "1"}) is None
    assert intra_op_threads(unbound, {"OMP_NUM_THREADS": "1",
                                      "VLLM_CPU_OMP_THREADS_BIND": "0"}) is None
    assert intra_op_threads(cuda_launch(gpu_engine(), "m", SPEC), {"OMP_NUM_THREADS": "1"}) is None


# What a Ray worker does when it inherits vLLM's LD_PRELOAD of torch's libgomp: the process starts
# with libgomp loaded, then Ray sets OMP_NUM_THREADS in Python, then torch is imported.
_RAY_WORKER = """
import os, sys
os.environ["OMP_NUM_THREADS"] = "1"
import torch
before = torch.get_num_threads()
if sys.argv[1] == "apply":
    from app.engine.engine_args import cpu_launch, intra_op_threads
    from app.config import EngineConfig
    torch.set_num_threads(intra_op_threads(cpu_launch(EngineConfig(), "m"), os.environ))
print(before, torch.get_num_threads())
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: one thread either way")
def test_the_thread_count_holds_when_libgomp_was_preloaded() -> None:
    import torch

    libgomp = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not libgomp:
        pytest.skip("this torch build has no bundled libgomp (vLLM preloads none)")
    env = {**os.environ, "LD_PRELOAD": str(libgomp[0])}
    env.pop("OMP_NUM_THREADS", None)
    root = Path(__file__).resolve().parents[2]

    def threads(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", _RAY_WORKER, mode], env=env, cwd=root,
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), int(out[1])

    # The variable alone is ignored: libgomp had read the environment before Ray set it ...
    default, left = threads("leave")
    assert default > 1 and left == default
    # ... the engine's start applies it.
    assert threads("apply") == (default, 1)


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
    # CUDA minor version compatibility: any 12.x runs on 525.60.13 or newer, 13.x on 580.
    assert driver_problem("12.8", "535.183.01") is None
    problem = driver_problem("12.8", "520.61.05")
    assert problem is not None
    assert "520.61.05" in problem and "525.60.13" in problem and "CUDA 12.8" in problem
    with pytest.raises(ValueError):
        minimum_driver("10.2")


@pytest.mark.parametrize(
    ("cuda", "driver", "verdict"),
    [
        ("12.8", "525.60.13", "warn"),  # the 12.x floor itself
        ("12.8", "525.60.12", "refuse"),
        ("12.8", "535.183.01", "warn"),  # between the floor and 12.8's own 570.26
        ("12.8", "570.26", "ok"),
        ("12.4", "550.54.14", "ok"),
        ("13.0", "575.51.03", "refuse"),  # a 12.x driver: nothing of 13.x runs
        ("13.0", "580.0", "warn"),
        ("13.0", "580.65.06", "ok"),
        ("13.1", "580.82.07", "warn"),
        ("11.8", "450.80.02", "warn"),
        ("11.8", "450.51.06", "refuse"),
        ("14.0", "600.1", "warn"),  # a major version this code does not know: not refused
    ],
)
def test_the_driver_is_refused_below_the_major_versions_floor_only(
        cuda: str, driver: str, verdict: str) -> None:
    check = driver_check(cuda, driver)
    got = "refuse" if check.refusal else "warn" if check.warning else "ok"
    assert got == verdict, check
    assert check.refusal is None or check.warning is None


def test_batch_invariant_reaches_the_cuda_engines_environment() -> None:
    from app.engine.engine_args import BATCH_INVARIANT_ENV

    strict = EngineConfig(dtype="bfloat16", batch_invariant=True)
    assert cuda_launch(strict, "m").env[BATCH_INVARIANT_ENV] == "1"
    assert BATCH_INVARIANT_ENV not in cuda_launch(EngineConfig(dtype="bfloat16"), "m").env


def test_stats_and_the_scheduling_policy_reach_vllm() -> None:
    """Issue 42: vLLM's stats on by default (its `vllm:*` metrics), off by `log_stats`; the
    priority policy only when asked (vLLM's default is fcfs)."""
    on = cpu_launch(EngineConfig(), "/m", SPEC).kwargs
    assert on["disable_log_stats"] is False and "scheduling_policy" not in on
    off = cpu_launch(EngineConfig(log_stats=False, scheduling_policy="priority"), "/m",
                     SPEC).kwargs
    assert off["disable_log_stats"] is True and off["scheduling_policy"] == "priority"
    from vllm import EngineArgs

    EngineArgs(**{k: v for k, v in off.items() if k != "speculative_config"})  # vLLM takes them
