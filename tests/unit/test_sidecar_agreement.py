"""The sidecar agreement harness: plain's calls read back, overrides, the table."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from load_tests.choice_prompts import plain_tools
from load_tests.sidecar_agreement import Tally, plain_calls, plain_steps, report, sidecar_args


def _bench_file(tmp_path: Path) -> Path:
    call = {"name": "f", "arguments": json.dumps({"a": 1})}
    records = [
        {"case_id": "c0", "mode": "plain", "warmup": False, "tool_calls": [call], "steps": 9},
        {"case_id": "c0", "mode": "sidecar", "warmup": False, "tool_calls": [call], "steps": 4},
        {"case_id": "c1", "mode": "plain", "warmup": True, "tool_calls": [call], "steps": 9},
        {"case_id": "c2", "mode": "plain", "warmup": False, "tool_calls": [], "steps": 3},
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"records": records}))
    return path


def test_plain_calls_are_plains_committed_calls_only(tmp_path: Path) -> None:
    calls = plain_calls(_bench_file(tmp_path))
    assert list(calls) == ["c0"]
    assert calls["c0"][0].name == "f" and calls["c0"][0].arguments == {"a": 1}
    assert plain_tools(_bench_file(tmp_path)) == {"c0": "f"}
    assert plain_steps(_bench_file(tmp_path)) == {"c0": 9}


def test_overrides_go_over_the_configs_sidecar_settings(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"applications": [{"args": {
        "sidecar": {"waves": 1, "choice_prompt": "signatures"}, "tools": ["x"]}}]}))
    args = sidecar_args(str(config), ["waves=2", "choice_prompt=names", "verify=true"])
    assert args == {"sidecar": {"waves": 2, "choice_prompt": "names", "verify": True}}


def test_the_table_adds_the_categories_per_adapter() -> None:
    tallies = {("a", True): Tally(cases=2, whole=1, required=2, times_ms=[10.0, 30.0],
                                  passes=[4, 6], plain_steps=[20, 20]),
               ("b", True): Tally(cases=2, whole=2, required=2, other_tool=0, times_ms=[20.0],
                                  passes=[5], plain_steps=[10]),
               ("a", False): Tally(cases=2, whole=0, required=1, other_tool=1)}
    lines = report(tallies, [True, False])
    assert lines[-2].startswith("all adapter") and "whole 3/4 (75%)" in lines[-2]
    assert "(median)    20 ms,  5.0 passes vs plain's 20.0 (0.25x)" in lines[-2]
    assert lines[-1].startswith("all base") and "other tool   1" in lines[-1]
