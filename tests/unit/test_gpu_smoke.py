"""The CPU-side parts of scripts/gpu_smoke.sh (load_tests/gpu_smoke.py): its config, its
request set and its report. The GPU run itself happens on an operator's GPU host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.config_check import check_file
from load_tests.bench import Record as BenchRecord
from load_tests.bench import RequestSettings, build_request, parse_modes
from load_tests.gpu_smoke import (
    ALL_MODES,
    SMOKE_CONFIG,
    SmokeRow,
    deployed_modes,
    format_smoke,
    run_cases,
    run_records,
    smoke_cases,
    smoke_problems,
    smoke_report,
    smoke_rows,
)
from tests.unit.test_bench import FakeCompletions, cases_q, fake_client

ROOT = Path(__file__).resolve().parents[2]


def args_of(path: Path) -> dict[str, Any]:
    (application,) = yaml.safe_load(path.read_text())["applications"]
    args: dict[str, Any] = application["args"]
    return args


def test_smoke_config_is_the_gpu_config_on_one_gpu() -> None:
    report = check_file(ROOT / SMOKE_CONFIG)
    assert report.ok, report.errors
    (app,) = report.applications
    engines = [d for d in app.deployments if d.engine_args is not None]
    assert {d.name for d in engines} == {"MainModel", "Sidecar"}
    assert all(d.platform == "cuda" for d in engines)
    # One GPU: the replicas' GPU shares add up to at most one.
    assert sum(float(d.actor.get("num_gpus", 0)) for d in app.deployments) <= 1
    # Same models, precision and context as the cluster config it stands for.
    smoke = args_of(ROOT / SMOKE_CONFIG)
    cluster = args_of(ROOT / "configs" / "cluster-gpu-h100-l4.yaml")
    for part in ("main", "sidecar"):
        for key in ("model", "dtype", "max_model_len", "enforce_eager"):
            assert smoke[part]["engine"][key] == cluster[part]["engine"][key], (part, key)


def test_request_set_is_bfcl_with_speculation_off_and_on() -> None:
    cases = smoke_cases(2)
    assert [c.category for c in cases] == ["simple_python"] * 2 + ["multiple"] * 2
    plain, ooo = parse_modes("plain,ooo")
    settings = RequestSettings(model="qwen3-8b")
    assert build_request(cases[0], plain, settings)["extra_body"]["ooo_spec"]["enabled"] is False
    assert build_request(cases[0], ooo, settings)["extra_body"]["ooo_spec"]["enabled"] is True


def test_report_from_a_run_against_a_fake_server() -> None:
    completions = FakeCompletions()
    rows, stop = run_cases(fake_client(completions), cases_q(3), "m", timeout_s=5)
    assert stop is None
    assert [r.case_id for r in rows] == ["simple_python_0", "simple_python_1", "simple_python_2"]
    first = rows[0]
    assert (first.plain_passes, first.ooo_passes, first.ooo_tokens) == (10, 2, 20)
    assert first.ooo_tokens_per_pass == 10.0
    assert first.identical is True and rows[1].identical is False  # the fake's q1 differs
    problems = smoke_problems(rows, stop)
    assert problems == []
    text = format_smoke(rows, problems)
    assert "tokens/pass" in text and "10.00" in text and "NO" in text
    assert "30 passes plain, 6 with speculation" in text and text.endswith("PASS")


def test_failures_make_the_smoke_fail() -> None:
    completions = FakeCompletions(fail_on={("q0", "ooo")})
    rows, stop = run_cases(fake_client(completions), cases_q(2), "m", timeout_s=5)
    problems = smoke_problems(rows, stop)
    assert problems and "simple_python_0" in problems[0] and "boom" in problems[0]
    assert format_smoke(rows, problems).splitlines()[-1].startswith("FAIL")


def test_no_drafting_at_all_fails() -> None:
    def record(mode: str, steps: int) -> BenchRecord:
        return BenchRecord(case_id="c", category="simple_python", mode=mode, position=0,
                           steps=steps, completion_tokens=steps)

    rows = smoke_rows([record("plain", 12), record("ooo", 12)])
    assert rows == [SmokeRow("c", 12, 12, 12, 12, None, None)]
    assert any("never drafted" in p for p in smoke_problems(rows))
    assert smoke_problems([]) == ["no case was sent"]


def test_the_script_stops_before_starting_anything_when_the_models_are_absent(
    tmp_path: Path,
) -> None:
    """scripts/gpu_smoke.sh on an image built without the models: with the hub offline (its
    default) `config check` names the missing models and the script exits before the app
    starts. A stand-in nvidia-smi gets it past the GPU check on this CPU machine; the empty
    hub cache stands for the image's."""
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559 MiB, 580.82.07'\n")
    smi.chmod(0o755)
    (tmp_path / "hub").mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--limit", "1"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "`main.engine.model` = 'Qwen/Qwen3-8B' is not in the Hugging Face cache" in done.stdout
    assert "load_tests" not in done.stderr  # the smoke run itself never started


def test_every_mode_runs_where_the_config_deploys_its_engine() -> None:
    h200 = yaml.safe_load((ROOT / "configs" / "gpu-smoke-1gpu-h200.yaml").read_text())
    assert deployed_modes(h200, ALL_MODES) == (list(ALL_MODES), {})
    h100 = yaml.safe_load((ROOT / SMOKE_CONFIG).read_text())
    modes, skipped = deployed_modes(h100, ALL_MODES)
    assert modes == ["plain", "drafts", "ooo"] and set(skipped) == {"ngram", "suffix"}


def test_the_json_report_has_passes_times_and_acceptance_per_mode() -> None:
    completions = FakeCompletions()
    records, stop = run_records(fake_client(completions), cases_q(2), "m", 5, "plain,ooo")
    report = smoke_report(records, stop, {"gpu": "H200"}, "c.yaml", ["plain", "ooo"], {},
                          {"total_s": 1.0})
    assert report["passed"] and report["facts"] == {"gpu": "H200"}
    ooo = report["per_mode"]["ooo"]
    assert ooo["requests"] == 2 and ooo["errors"] == 0
    assert ooo["passes"] == 4 and ooo["tokens_per_pass"] == 10.0
    assert ooo["identical_to_plain"] == "1/2"  # the fake's q1 differs
    assert ooo["e2e_ms_median"] is not None
    assert [c["case_id"] for c in report["cases"]] == ["simple_python_0", "simple_python_1"]


def test_the_dry_run_rehearses_every_step_without_a_gpu(tmp_path: Path) -> None:
    """scripts/gpu_smoke.sh --dry-run, as CI runs it: the install's extra, `config check` of
    the every-mode config, every case's request in every mode, the JSON report written."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHON": sys.executable,
           "PATH": ":".join(p for p in os.environ["PATH"].split(":")
                            if not os.path.exists(os.path.join(p, "nvidia-smi")))}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--dry-run", "--install",
         "--out", str(out), "--limit", "1"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would run:" in done.stderr and "requests built per mode" in done.stderr
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["facts"]["dry_run"] and report["passed"]
    assert report["modes"] == list(ALL_MODES) and report["skipped_modes"] == {}
    assert report["config"] == "configs/gpu-smoke-1gpu-h200.yaml"
