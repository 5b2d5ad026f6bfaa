"""`ooo-spec config check` (app/config_check.py): every shipped config passes, the GPU config's
engines get what a GPU needs, and configs that cannot start fail naming the setting."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main as cli_main
from app.config import AppConfig
from app.config_check import (
    CODE_DEFAULT,
    KNOWN_MODELS,
    ConfigReport,
    check_file,
    check_text,
    deployment_actor_options,
    dims_from_config_json,
    kv_bytes_for_request,
    kv_bytes_per_token,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(ROOT.glob("configs/*.yaml")) + sorted(
    ROOT.glob("k8s/overlays/*/serve-config.yaml")
)
GPU_CONFIG = ROOT / "configs" / "cluster-gpu-h100-l4.yaml"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def check(config: dict[str, Any]) -> ConfigReport:
    return check_text(yaml.safe_dump(config), "test")


def deployment(report: ConfigReport, name: str) -> Any:
    (app,) = report.applications
    return next(d for d in app.deployments if d.name == name)


def test_shipped_configs_are_all_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in SHIPPED}
    assert {"configs/local.yaml", "configs/cluster-gpu-h100-l4.yaml",
            "configs/gpu-smoke-1gpu.yaml", "k8s/overlays/gpu-h100-l4/serve-config.yaml",
            "k8s/overlays/cpu-dev/serve-config.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shipped_config_passes(path: Path) -> None:
    report = check_file(path)
    assert report.applications, path
    assert report.ok, report.errors
    engines = [d for a in report.applications for d in a.deployments if d.engine_args]
    assert engines and all(d.kv_cache is not None and d.kv_cache.fits for d in engines)


def test_gpu_config_engines_get_gpu_memory_utilization_and_no_kv_cache_bytes() -> None:
    report = check_file(GPU_CONFIG)
    for name in ("MainModel", "Sidecar"):
        dep = deployment(report, name)
        assert dep.platform == "cuda"
        assert dep.engine_args["gpu_memory_utilization"] == 0.9
        assert "kv_cache_memory_bytes" not in dep.engine_args
        assert not [k for k in dep.env or {} if k.startswith("VLLM_CPU_")]
        assert dep.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert deployment(report, "MainModel").gpu_type == "H100"
    assert deployment(report, "Sidecar").gpu_type == "L4"


def test_the_old_half_gib_cache_on_gpus_fails_naming_the_setting() -> None:
    config = load(GPU_CONFIG)
    config["applications"][0]["args"]["main"]["engine"]["kv_cache_gib"] = 0.5
    report = check(config)
    assert not report.ok
    (error,) = report.errors
    assert "MainModel" in error and "`main.engine.kv_cache_gib`" in error
    assert "32768" in error


def test_a_gpu_too_small_for_max_model_len_names_gpu_memory_utilization() -> None:
    config = load(GPU_CONFIG)
    engine = config["applications"][0]["args"]["main"]["engine"]
    engine.update(gpu_type="L4", gpu_memory_utilization=0.8)
    report = check(config)
    (error,) = report.errors
    assert "`main.engine.gpu_memory_utilization`" in error and "max_model_len" in error


def test_cpu_cache_too_small_fails_naming_kv_cache_gib() -> None:
    config = load(ROOT / "configs" / "local.yaml")
    sidecar = config["applications"][0]["args"]["sidecar"]["engine"]
    sidecar.update(kv_cache_gib=0.05, max_model_len=8192)
    report = check(config)
    (error,) = report.errors
    assert "Sidecar" in error and "`sidecar.engine.kv_cache_gib`" in error


def test_unknown_gpu_type_and_unknown_model_name_their_settings() -> None:
    config = load(GPU_CONFIG)
    args = config["applications"][0]["args"]
    args["main"]["engine"]["gpu_type"] = "Z9000"
    args["sidecar"]["engine"]["model"] = "acme/unknown-1b"
    errors = " | ".join(check(config).errors)
    assert "`main.engine.gpu_type`" in errors and "Z9000" in errors
    assert "`sidecar.engine.model_dims`" in errors
    args["sidecar"]["engine"]["model_dims"] = {
        "num_hidden_layers": 16, "num_key_value_heads": 8, "head_dim": 64,
        "num_parameters": 1e9,
    }
    args["main"]["engine"]["gpu_type"] = "H100"
    assert check(config).ok


def test_invalid_args_are_errors_with_their_path() -> None:
    config = load(ROOT / "configs" / "local.yaml")
    config["applications"][0]["args"]["main"]["engine"]["max_model_len"] = 4
    config["applications"][0]["args"]["main"]["engine"]["typo"] = 1
    errors = check(config).errors
    assert any("args.main.engine.max_model_len" in e for e in errors)
    assert any("args.main.engine.typo" in e for e in errors)


def test_a_shared_gpu_must_keep_within_its_share() -> None:
    config = load(ROOT / "configs" / "gpu-smoke-1gpu.yaml")
    args = config["applications"][0]["args"]
    assert check(config).ok
    args["main"]["engine"]["gpu_memory_utilization"] = 0.9
    assert any("`main.engine.gpu_memory_utilization`" in e for e in check(config).errors)
    args["main"]["engine"]["gpu_memory_utilization"] = 0.55
    args["main"]["engine"]["kv_cache_gib"] = 60
    assert any("`main.engine.kv_cache_gib`" in e for e in check(config).errors)


def test_ngram_baseline_on_gpus_needs_its_own_gpu() -> None:
    config = load(GPU_CONFIG)
    args = config["applications"][0]["args"]
    args["baselines"] = {"ngram": {"enabled": True}}
    errors = check(config).errors
    assert any("MainModelNgram" in e and "num_gpus" in e for e in errors)
    config["applications"][0]["deployments"].append({
        "name": "MainModelNgram", "ray_actor_options": {"num_gpus": 1,
                                                        "resources": {"main_pool": 1}}})
    report = check(config)
    assert report.ok, report.errors
    ngram = deployment(report, "MainModelNgram")
    assert ngram.engine_args["speculative_config"]["method"] == "ngram"
    assert ngram.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_actor_options_come_from_serve_deployments_entries_first() -> None:
    config = load(GPU_CONFIG)
    application = config["applications"][0]
    app_config = AppConfig.model_validate(application["args"])
    before = deployment_actor_options(application, app_config)
    assert before["MainModel"][0].num_gpus == 1
    assert before["MainModel"][1] == "deployments[MainModel].ray_actor_options"
    application["deployments"] = [
        {"name": "MainModel", "ray_actor_options": {
            "num_cpus": 8, "num_gpus": 1, "accelerator_type": "A100-80G",
            "resources": {"main_pool": 1}, "runtime_env": {}}},
    ]
    after = deployment_actor_options(application, app_config)
    assert after["MainModel"][0].num_cpus == 8
    assert after["MainModel"][1] == "deployments[MainModel].ray_actor_options"
    assert after["Sidecar"][1] == CODE_DEFAULT  # no entry: one CPU, no GPU
    assert after["Sidecar"][0].num_gpus == 0
    # An engine without gpu_type takes the deployment's accelerator type.
    del application["args"]["main"]["engine"]["gpu_type"]
    assert deployment(check(config), "MainModel").gpu_type == "A100-80G"


def test_kv_bytes_follow_vllms_formula() -> None:
    qwen8b = KNOWN_MODELS["qwen/qwen3-8b"]
    per_token = kv_bytes_per_token(qwen8b, 2)
    assert per_token == 2 * 36 * 8 * 128 * 2
    # 32768 tokens in 16-token blocks plus the null block: the "about 4.5 GiB".
    assert kv_bytes_for_request(per_token, 32768, 16) == (2048 + 1) * 16 * per_token
    assert 4.4 < kv_bytes_for_request(per_token, 32768, 16) / (1 << 30) < 4.6
    qwen06 = kv_bytes_per_token(KNOWN_MODELS["qwen/qwen3-0.6b"], 2)
    assert 3.4 < kv_bytes_for_request(qwen06, 32768, 16) / (1 << 30) < 3.6


def test_dims_from_a_config_json_match_the_table() -> None:
    qwen3_8b = {
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "num_hidden_layers": 36, "intermediate_size": 12288,
        "vocab_size": 151936, "tie_word_embeddings": False,
    }
    dims = dims_from_config_json(qwen3_8b)
    table = KNOWN_MODELS["qwen/qwen3-8b"]
    assert (dims.num_hidden_layers, dims.num_key_value_heads, dims.head_dim) == (
        table.num_hidden_layers, table.num_key_value_heads, table.head_dim)
    assert abs(dims.num_parameters - table.num_parameters) / table.num_parameters < 0.02


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "check", str(GPU_CONFIG), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["errors"] == []
    bad = copy.deepcopy(load(GPU_CONFIG))
    bad["applications"][0]["args"]["sidecar"]["engine"]["kv_cache_gib"] = 0.5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli_main(["config", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "`sidecar.engine.kv_cache_gib`" in out and "cannot start" in out
    (tmp_path / "empty.yaml").write_text("a: 1\n")
    assert cli_main(["config", "check", str(tmp_path / "empty.yaml")]) == 1
