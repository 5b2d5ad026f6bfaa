"""`ooo-spec config check` (app/config_check/): every shipped config passes, the GPU config's
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
    model_max_len,
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


# ---------------------------------------------------------------- what fails at start (issue 32)


def _main_engine(config: dict[str, Any]) -> dict[str, Any]:
    engine: dict[str, Any] = config["applications"][0]["args"]["main"]["engine"]
    return engine


def _check_file_of(tmp_path: Path, config: dict[str, Any]) -> ConfigReport:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return check_file(path)


def test_bf16_on_a_t4_is_refused_naming_dtype(tmp_path: Path) -> None:
    config = load(GPU_CONFIG)
    _main_engine(config).update(gpu_type="T4", max_model_len=4096)
    report = _check_file_of(tmp_path, config)
    errors = [e for e in report.errors if "MainModel" in e]
    assert any("`main.engine.dtype` = bfloat16" in e and "T4" in e and "7.5" in e
               for e in errors), errors
    _main_engine(config)["dtype"] = "float16"
    assert not [e for e in check(config).errors if "dtype" in e]
    # Ampere and newer run it.
    for gpu in ("A100-80G", "L4", "H100"):
        assert "bfloat16" not in " ".join(check_dtype_only(gpu))


def check_dtype_only(gpu_type: str) -> list[str]:
    config = load(GPU_CONFIG)
    _main_engine(config).update(gpu_type=gpu_type)
    return [e for e in check(config).errors if "dtype" in e]


def test_a_max_model_len_beyond_the_models_limit_is_refused(tmp_path: Path) -> None:
    config = load(GPU_CONFIG)
    _main_engine(config)["max_model_len"] = 65_536
    (error,) = [e for e in _check_file_of(tmp_path, config).errors if "limit" in e]
    assert "`main.engine.max_model_len` = 65536" in error and "40960" in error
    assert deployment(check(load(GPU_CONFIG)), "MainModel").max_model_len_limit == 40_960


def test_the_models_limit_comes_from_its_config_json_with_rope_scaling(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    hf_config = {
        "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 512,
        "vocab_size": 1000, "max_position_embeddings": 2048,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    (folder / "config.json").write_text(json.dumps(hf_config))
    assert model_max_len(hf_config) == (8192, "max_position_embeddings x rope_scaling.factor 4.0")
    # YaRN's max_position_embeddings is already the scaled length, as vLLM reads it.
    yarn = {**hf_config, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert model_max_len(yarn) == (2048, "max_position_embeddings")
    config = load(ROOT / "configs" / "local.yaml")
    _main_engine(config).update(model=str(folder), max_model_len=8192, kv_cache_gib=1)
    assert not [e for e in check(config).errors if "limit" in e]
    _main_engine(config)["max_model_len"] = 8193
    assert any("`main.engine.max_model_len` = 8193" in e and "8192" in e
               for e in check(config).errors)


def _fake_hub_snapshot(cache: Path, repo: str, with_weights: bool) -> None:
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snapshot = folder / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "num_hidden_layers": 28, "intermediate_size": 3072,
        "vocab_size": 151936, "max_position_embeddings": 40960,
    }))
    if with_weights:
        (snapshot / "model.safetensors").write_bytes(b"")


def test_a_missing_model_with_the_hub_offline_is_refused_naming_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    config = load(GPU_CONFIG)
    assert check(config).ok  # online: vLLM would download the weights
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    errors = _check_file_of(tmp_path, config).errors
    assert any("`main.engine.model` = 'Qwen/Qwen3-8B'" in e and "HF_HUB_OFFLINE" in e
               for e in errors), errors
    assert any("`sidecar.engine.model` = 'Qwen/Qwen3-0.6B'" in e for e in errors)
    _fake_hub_snapshot(cache, "Qwen/Qwen3-0.6B", with_weights=False)
    _fake_hub_snapshot(cache, "Qwen/Qwen3-8B", with_weights=True)
    errors = check(config).errors
    assert not [e for e in errors if "main.engine.model" in e]
    assert [e for e in errors if "sidecar.engine.model" in e], "a config.json is not weights"


def test_gpu_configs_show_the_sidecars_speculative_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path in (GPU_CONFIG, ROOT / "configs" / "gpu-smoke-1gpu.yaml"):
        assert cli_main(["config", "check", "--json", str(path)]) == 0
        report = json.loads(capsys.readouterr().out)
        (app,) = report["applications"]
        by_name = {d["name"]: d for d in app["deployments"]}
        for name in ("MainModel", "Sidecar"):
            spec = by_name[name]["speculative_config"]
            assert spec["method"] == "custom_class"
            assert spec["num_speculative_tokens"] == 16
            assert by_name[name]["engine_args"]["speculative_config"] == spec


def _tensor_parallel(config: dict[str, Any], tp: int) -> dict[str, Any]:
    application = config["applications"][0]
    _main_engine(config)["tensor_parallel_size"] = tp
    entry = next(d for d in application["deployments"] if d["name"] == "MainModel")
    entry["ray_actor_options"]["num_gpus"] = tp
    actor = entry["ray_actor_options"]
    entry["placement_group_bundles"] = [
        {"CPU": float(actor["num_cpus"]), "GPU": float(tp),
         **{k: float(v) for k, v in actor["resources"].items()}}
    ]
    entry["placement_group_strategy"] = "STRICT_PACK"
    return config


def test_a_tensor_parallel_variant_shows_its_placement_in_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _tensor_parallel(load(GPU_CONFIG), 4)
    entry = next(d for d in config["applications"][0]["deployments"] if d["name"] == "MainModel")
    cpus = float(entry["ray_actor_options"]["num_cpus"])
    path = tmp_path / "tp4.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["config", "check", "--json", str(path)]) == 0, capsys.readouterr().out
    report = json.loads(capsys.readouterr().out)
    main = next(d for d in report["applications"][0]["deployments"] if d["name"] == "MainModel")
    assert main["tensor_parallel_size"] == 4
    assert main["engine_args"]["tensor_parallel_size"] == 4
    assert main["engine_args"]["distributed_executor_backend"] == "mp"
    assert main["placement"] == {
        "num_gpus": 4,
        "placement_group_bundles": [{"CPU": cpus, "GPU": 4.0, "main_pool": 1.0}],
        "placement_group_strategy": "STRICT_PACK",
    }


def test_tensor_parallel_needs_its_gpus_in_the_deployment_options() -> None:
    config = load(GPU_CONFIG)
    _main_engine(config)["tensor_parallel_size"] = 2
    errors = [e for e in check(config).errors if "tensor_parallel_size" in e]
    assert any("ray_actor_options.num_gpus` to 2" in e for e in errors), errors
    assert any("placement_group_bundles" in e and "STRICT_PACK" in e for e in errors)
    assert check(_tensor_parallel(load(GPU_CONFIG), 2)).ok
    cpu = load(ROOT / "configs" / "local.yaml")
    _main_engine(cpu)["tensor_parallel_size"] = 2
    assert any("needs GPUs" in e and "`main.engine.tensor_parallel_size`" in e
               for e in check(cpu).errors)


def test_the_recommended_bundle_carries_memory_and_the_accelerator_type() -> None:
    """Every resource Ray demands of the replica actor is in the bundle `config check`
    recommends (Ray's own conversion: `resources_from_ray_options`), or the replica would
    stay pending; the last round's bundle without them is refused, naming the right one."""
    from ray._common.utils import resources_from_ray_options

    config = _tensor_parallel(load(GPU_CONFIG), 2)
    entry = next(d for d in config["applications"][0]["deployments"] if d["name"] == "MainModel")
    entry["ray_actor_options"].update(memory=64 * 2**30, accelerator_type="H100")
    report = check(config)
    errors = [e for e in report.errors if "placement_group_bundles" in e]
    assert errors and "'memory': 68719476736.0" in errors[0]
    assert "'accelerator_type:H100': 0.001" in errors[0]
    main = next(d for d in report.applications[0].deployments if d.name == "MainModel")
    assert main.placement is not None
    (bundle,) = main.placement.placement_group_bundles
    for resource, amount in resources_from_ray_options(entry["ray_actor_options"]).items():
        assert bundle.get(resource, 0) >= amount, resource
    entry["placement_group_bundles"] = main.placement.placement_group_bundles
    assert check(config).ok, check(config).errors


def test_tensor_parallel_4_on_a_1_gpu_worker_group_is_refused(tmp_path: Path) -> None:
    """A RayService manifest: the worker group the pool resource pins MainModel to has one
    GPU per pod (k8s/base/rayservice.yaml), so four ranks cannot be on one node."""
    config = _tensor_parallel(load(GPU_CONFIG), 4)
    rayservice = yaml.safe_load((ROOT / "k8s" / "base" / "rayservice.yaml").read_text())
    rayservice["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    path = tmp_path / "rayservice.yaml"
    path.write_text(yaml.safe_dump(rayservice))
    errors = check_file(path).errors
    (error,) = [e for e in errors if "worker group" in e]
    assert "'main'" in error and "1 per pod" in error and "nvidia.com/gpu to 4" in error
    assert "`main.engine.tensor_parallel_size`" in error
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        if group["groupName"] == "main":
            for key in ("requests", "limits"):
                group["template"]["spec"]["containers"][0]["resources"][key][
                    "nvidia.com/gpu"] = "4"
    path.write_text(yaml.safe_dump(rayservice))
    assert check_file(path).ok, check_file(path).errors


def test_batch_invariant_is_checked_against_the_platform_and_gpu() -> None:
    config = load(GPU_CONFIG)
    _main_engine(config)["batch_invariant"] = True
    report = check(config)
    assert report.ok, report.errors
    assert deployment(report, "MainModel").env["VLLM_BATCH_INVARIANT"] == "1"
    _main_engine(config).update(gpu_type="T4", dtype="float16", max_model_len=4096)
    assert any("`main.engine.batch_invariant` needs compute capability 8.0" in e
               for e in check(config).errors)
    cpu = load(ROOT / "configs" / "local.yaml")
    _main_engine(cpu)["batch_invariant"] = True
    assert any("`main.engine.batch_invariant` is vLLM's CUDA mode" in e for e in check(cpu).errors)


def test_tensor_parallel_must_divide_the_attention_heads() -> None:
    """What vLLM refused on this machine: the embedded model has 9 heads, so TP 2 cannot start
    (TP 3 did); the heads come from the model's local config.json."""
    config = load(ROOT / "configs" / "local.yaml")
    _main_engine(config)["tensor_parallel_size"] = 2
    assert any("does not divide the model's 9 attention heads" in e
               for e in check(config).errors)
    _main_engine(config)["tensor_parallel_size"] = 3
    assert not [e for e in check(config).errors if "attention heads" in e]


def test_the_anonymous_cap_may_not_exceed_what_the_router_holds() -> None:
    """Beyond the Router's `max_ongoing_requests` Serve queues requests where no limit answers
    them (issue 39: 256 anonymous engine requests against a router of 64)."""
    config = load(ROOT / "configs" / "local.yaml")
    app = config["applications"][0]
    app["args"].setdefault("auth", {})["max_concurrent_anonymous"] = 256
    errors = check(config).errors
    assert any("max_concurrent_anonymous is 256" in e and "(64)" in e for e in errors)
    app["deployments"] = [e for e in app.get("deployments") or [] if e.get("name") != "Router"]
    app["deployments"].append({"name": "Router", "max_ongoing_requests": 300})
    assert not any("max_concurrent_anonymous" in e for e in check(config).errors)
    app["args"]["auth"]["max_concurrent_anonymous"] = 64
    app["deployments"][-1]["max_ongoing_requests"] = 64
    assert not any("max_concurrent_anonymous" in e for e in check(config).errors)
