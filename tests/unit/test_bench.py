"""The benchmark harness without a server (load_tests.bench, load_tests.report): mode registry,
dataset specs, request building, the interleaved run against a fake client, and the summary
math on synthetic records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from load_tests import bench, report
from load_tests.bench import (
    MODES,
    DatasetSpec,
    Mode,
    Record,
    RequestSettings,
    RunLimits,
    build_request,
    mark_agreement,
    mark_identity,
    mode_order,
    parse_dataset_spec,
    parse_modes,
    percentile,
    realign_effect,
    register_mode,
    run_bench,
    summarize,
)
from load_tests.bfcl import CORE_CATEGORIES, BfclCase

# ---------------------------------------------------------------- fixtures


def make_case(case_id: str = "simple_python_0", category: str = "simple_python") -> BfclCase:
    return BfclCase(
        id=case_id,
        category=category,
        messages=[{"role": "user", "content": "area of a triangle, base 10, height 5"}],
        tools=[{"type": "function", "function": {
            "name": "area",
            "description": "",
            "parameters": {"type": "object",
                           "properties": {"base": {"type": "integer"},
                                          "height": {"type": "integer"}},
                           "required": ["base", "height"]},
        }}],
        ground_truth=[{"area": {"base": [10], "height": [5]}}],
        bfcl_names={"area": "area"},
    )


def rec(case: str, mode: str, **kw: Any) -> Record:
    defaults: dict[str, Any] = {
        "category": "simple_python", "position": 0, "e2e_ms": 100.0, "outcome": "disabled",
        "steps": 10, "completion_tokens": 10, "drafted_tokens": 0, "accepted_tokens": 0,
        "decode_ms": 100.0, "content": None,
        "tool_calls": [{"name": "area", "arguments": '{"base": 10, "height": 5}'}],
        "correct": True,
    }
    defaults.update(kw)
    return Record(case_id=case, mode=mode, **defaults)


# ---------------------------------------------------------------- modes


def test_builtin_modes() -> None:
    assert MODES["plain"].extra_body == {"ooo_spec": {"enabled": False}}
    assert MODES["ngram"].extra_body == {"ooo_spec": {"enabled": False, "baseline": "ngram"}}
    # Only ooo+tools may pre-execute, and only where the server knows the tools.
    assert MODES["ooo"].extra_body == {"ooo_spec": {"enabled": True, "pre_execute": False}}
    assert MODES["ooo+tools"].extra_body == {"ooo_spec": {"enabled": True, "pre_execute": True}}
    assert MODES["drafts"].extra_body == {
        "ooo_spec": {"enabled": True, "pre_execute": False, "sidecar": False}}
    assert [m for m in MODES if not MODES[m].applies_to("bfcl")] == ["ooo+tools"]
    # The re-alignment and sidecar measurements are BFCL-only.
    assert [m for m in MODES if not MODES[m].applies_to("agent")] == [
        "ooo:no-realign", "sidecar", "sidecar+verify", "sidecar:base"]
    assert MODES["sidecar"].extra_body["ooo_spec"]["diagnostics"]["await_prediction"] is True
    # The sidecar without its LoRA adapter, beside `sidecar` in one run.
    assert MODES["sidecar:base"].extra_body["ooo_spec"]["diagnostics"] == {
        **MODES["sidecar"].extra_body["ooo_spec"]["diagnostics"], "sidecar_adapter": False}
    assert MODES["ooo:no-realign"].extra_body["ooo_spec"]["diagnostics"]["realign"] is False
    assert MODES["ooo:budget"].extra_body["ooo_spec"]["diagnostics"] == {"draft_worth": False}


def test_register_mode_and_parse() -> None:
    try:
        register_mode("ngram-test", {"ooo_spec": {"enabled": True, "max_steps": 2}})
        modes = parse_modes("plain, ngram-test,ooo")
        assert [m.name for m in modes] == ["plain", "ngram-test", "ooo"]
        assert modes[1].extra_body["ooo_spec"]["max_steps"] == 2
    finally:
        MODES.pop("ngram-test", None)


@pytest.mark.parametrize("spec", ["", "plain,nope", "plain,plain"])
def test_parse_modes_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_modes(spec)


@pytest.mark.parametrize("name", ["", "a,b", " x"])
def test_register_mode_rejects_bad_names(name: str) -> None:
    with pytest.raises(ValueError):
        register_mode(name, {})


def test_mode_order_rotates() -> None:
    modes = [Mode("a", {}), Mode("b", {}), Mode("c", {})]
    orders = [[m.name for m in mode_order(modes, i)] for i in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    # Over a full rotation every mode takes every position once.
    for position in range(3):
        assert {orders[i][position] for i in range(3)} == {"a", "b", "c"}


# ---------------------------------------------------------------- dataset specs


def test_parse_dataset_spec() -> None:
    assert parse_dataset_spec("bfcl:simple_python") == [DatasetSpec("bfcl", "simple_python")]
    assert parse_dataset_spec("bfcl:simple_python,multiple, bfcl:parallel,multiple") == [
        DatasetSpec("bfcl", "simple_python"),
        DatasetSpec("bfcl", "multiple"),
        DatasetSpec("bfcl", "parallel"),
    ]
    assert [s.category for s in parse_dataset_spec("bfcl:core")] == list(CORE_CATEGORIES)
    assert str(DatasetSpec("bfcl", "parallel_multiple")) == "bfcl:parallel_multiple"


@pytest.mark.parametrize("spec", ["", "simple_python", "hf:simple_python", "bfcl:nope"])
def test_parse_dataset_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_dataset_spec(spec)


# ---------------------------------------------------------------- requests


def test_build_request() -> None:
    settings = RequestSettings(model="m")
    kwargs = build_request(make_case(), MODES["plain"], settings)
    assert kwargs["tool_choice"] == "required"
    assert kwargs["temperature"] == 0
    assert kwargs["max_tokens"] == 256
    # BFCL asks the same question in every mode: no history candidates, and earlier outputs
    # (the suffix source) only from the mode's own runs.
    assert kwargs["extra_body"] == {"ooo_spec": {"enabled": False, "history": False,
                                                 "diagnostics": {"suffix_scope": "bench:plain"}}}
    assert "parallel_tool_calls" not in kwargs
    kwargs["extra_body"]["ooo_spec"]["enabled"] = True  # a copy: the registry is untouched
    assert MODES["plain"].extra_body == {"ooo_spec": {"enabled": False}}
    parallel = build_request(make_case("parallel_0", "parallel"), MODES["ooo"], settings)
    assert parallel["parallel_tool_calls"] is True
    assert build_request(make_case("pm_0", "parallel_multiple"), MODES["ooo"],
                         settings)["parallel_tool_calls"] is True


def test_score_output() -> None:
    case = make_case()
    assert bench.score_output([{"name": "area", "arguments": '{"base": 10, "height": 5.0}'}],
                              case)
    assert not bench.score_output([{"name": "area", "arguments": '{"base": 1, "height": 5}'}],
                                  case)
    assert not bench.score_output([{"name": "area", "arguments": "{not json"}], case)
    assert not bench.score_output([{"name": "area", "arguments": "[1]"}], case)
    assert not bench.score_output([], case)


# ---------------------------------------------------------------- a run against a fake client


class FakeCompletions:
    """Answers like the server: plain takes 10 steps, ooo 2 (a hit) except on case 1, where
    ooo commits different arguments (so it is not identical to plain)."""

    def __init__(self, fail_on: set[tuple[str, str]] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_on = fail_on or set()

    def create(self, **kwargs: Any) -> Any:
        mode = "ooo" if kwargs["extra_body"]["ooo_spec"]["enabled"] else "plain"
        question = kwargs["messages"][0]["content"]
        self.calls.append((question, mode, kwargs))
        if (question, mode) in self.fail_on:
            raise RuntimeError("boom")
        height = 6 if (mode == "ooo" and question == "q1") else 5
        arguments = json.dumps({"base": 10, "height": height})
        steps = 10 if mode == "plain" else 2
        message = SimpleNamespace(
            content=None,
            tool_calls=[SimpleNamespace(function=SimpleNamespace(name="area",
                                                                 arguments=arguments))],
        )
        report_ = {
            "enabled": mode == "ooo",
            "outcome": "disabled" if mode == "plain" else ("miss" if height == 6 else "hit"),
            "candidates": [] if mode == "plain" else [
                {"source": "sidecar", "name": "area", "arguments": {}, "valid": True,
                 "ready_ms": 40.0}],
            "main": {"steps": steps, "completion_tokens": 20, "drafted_tokens": 0,
                     "accepted_tokens": 20 - steps, "ttft_ms": 5.0,
                     "decode_ms": steps * 10.0},
            "tool_results": [],
            "timings_ms": {"total": 1.0, "sidecar": 30.0 if mode == "ooo" else 0.0,
                           "main": 1.0, "tools": 0.0},
        }
        return SimpleNamespace(
            choices=[SimpleNamespace(message=message, finish_reason="tool_calls")],
            usage=SimpleNamespace(completion_tokens=20),
            model_extra={"ooo_spec": report_},
        )


def fake_client(completions: FakeCompletions) -> Any:
    return SimpleNamespace(chat=SimpleNamespace(completions=completions))


def cases_q(n: int) -> list[BfclCase]:
    out = []
    for i in range(n):
        case = make_case(f"simple_python_{i}")
        messages = [{"role": "user", "content": f"q{i}"}]
        out.append(case.model_copy(update={"messages": messages}))
    return out


def test_run_interleaves_rotates_and_warms_up() -> None:
    completions = FakeCompletions()
    modes = parse_modes("plain,ooo")
    records, stop = run_bench(fake_client(completions), cases_q(3), modes,
                              RequestSettings(model="m"), warmup=2)
    assert stop is None
    sent = [(q, m) for q, m, _ in completions.calls]
    assert sent == [
        ("q0", "plain"), ("q0", "ooo"), ("q1", "ooo"), ("q1", "plain"),  # warm-up
        ("q0", "plain"), ("q0", "ooo"), ("q1", "ooo"), ("q1", "plain"),
        ("q2", "plain"), ("q2", "ooo"),
    ]
    assert all(kw["timeout"] == RunLimits().request_timeout_s for _, _, kw in completions.calls)
    assert [r.warmup for r in records] == [True] * 4 + [False] * 6
    assert all(r.identical_to_plain is None for r in records if r.warmup)
    measured = {(r.case_id, r.mode): r for r in records if not r.warmup}
    assert measured[("simple_python_0", "ooo")].identical_to_plain is True
    assert measured[("simple_python_1", "ooo")].identical_to_plain is False
    assert measured[("simple_python_1", "ooo")].correct is False
    assert measured[("simple_python_1", "plain")].identical_to_plain is True
    first = measured[("simple_python_0", "ooo")]
    assert (first.outcome, first.steps, first.candidate_ready_ms, first.sidecar_ms) == (
        "hit", 2, 40.0, 30.0)

    summary = summarize(records, ["plain", "ooo"])
    ooo = summary["modes"]["ooo"]
    assert ooo["n"] == 3 and ooo["outcomes"] == {"hit": 2, "miss": 1}
    assert ooo["identical_to_plain"] == pytest.approx(2 / 3)
    assert summary["modes"]["plain"]["accuracy"] == 1.0
    assert summary["vs_plain"]["ooo"]["steps_ratio"] == 5.0
    text = report.format_summary(summary)
    assert "hit:2 miss:1" in text and "5.00x" in text


def test_run_records_errors_and_stops_after_too_many() -> None:
    completions = FakeCompletions(fail_on={("q1", "ooo"), ("q1", "plain"), ("q2", "plain")})
    records, stop = run_bench(
        fake_client(completions), cases_q(4), parse_modes("plain,ooo"),
        RequestSettings(model="m"), warmup=0, limits=RunLimits(max_consecutive_errors=3),
    )
    assert stop is not None and "3 failed requests in a row" in stop
    assert len(records) == 5  # q0 x2, q1 x2, q2 plain; q2 ooo and q3 never sent
    assert [r.error for r in records[2:]] == ["RuntimeError: boom"] * 3
    # A case whose plain run failed has no identity verdict.
    assert all(r.identical_to_plain is None for r in records if r.case_id != "simple_python_0")


def test_run_stops_when_time_budget_is_spent() -> None:
    ticks = iter(range(0, 10_000, 50))
    records, stop = run_bench(
        fake_client(FakeCompletions()), cases_q(10), parse_modes("plain,ooo"),
        RequestSettings(model="m"), warmup=0, limits=RunLimits(max_duration_s=120),
        clock=lambda: float(next(ticks)),
    )
    assert stop is not None and "time budget" in stop
    assert 0 < len(records) < 20


def test_describe_error_uses_server_message() -> None:
    exc = RuntimeError("x")
    exc.status_code = 503  # type: ignore[attr-defined]
    exc.body = {"message": "the main model is unavailable"}  # type: ignore[attr-defined]
    assert bench.describe_error(exc) == "HTTP 503: the main model is unavailable"
    assert bench.describe_error(TimeoutError()) == "TimeoutError: TimeoutError"


# ---------------------------------------------------------------- summary math


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([10, 0, 5], 0) == 0 and percentile([10, 0, 5], 100) == 10


def synthetic() -> list[Record]:
    records = []
    # Plain: steps 10, 20, 30, 40; decode 100..400 ms; e2e decode + 10.
    for i, steps in enumerate([10, 20, 30, 40]):
        records.append(rec(f"c{i}", "plain", steps=steps, decode_ms=steps * 10.0,
                           e2e_ms=steps * 10.0 + 10, completion_tokens=steps))
    # ooo: hits on c0, c1 (2 and 4 steps), miss on c2 (30 steps, different output),
    # partial on c3 (20 steps), plus an error on a warm-up and a measured error.
    ooo = [("c0", "hit", 2, 2), ("c1", "hit", 4, 4), ("c2", "miss", 30, 30),
           ("c3", "partial", 20, 10)]
    for case, outcome, steps, decode_factor in ooo:
        n_tokens = {"c0": 10, "c1": 20, "c2": 30, "c3": 40}[case]
        records.append(rec(case, "ooo", outcome=outcome, steps=steps,
                           decode_ms=decode_factor * 10.0, e2e_ms=decode_factor * 10.0 + 20,
                           completion_tokens=n_tokens, accepted_tokens=n_tokens - steps,
                           candidate_ready_ms=50.0 + steps, candidates=1, sidecar_ms=40.0,
                           correct=outcome != "miss", position=int(case in ("c0", "c2"))))
    records[6].tool_calls = [{"name": "area", "arguments": '{"base": 10, "height": 6}'}]
    records.append(rec("c0", "ooo", warmup=True, steps=1000, outcome="hit"))
    records.append(rec("c4", "ooo", error="HTTP 503: busy", steps=None, outcome=None))
    mark_identity(records)
    return records


def test_mark_identity_compares_calls_and_content() -> None:
    records = [rec("a", "plain", content=None), rec("a", "ooo", content=""),
               rec("b", "plain"), rec("b", "ooo"),
               rec("c", "ooo"),  # no plain run
               rec("d", "plain"),
               rec("d", "ooo", tool_calls=[{"name": "area",
                                            "arguments": '{"height": 5, "base": 10}'}])]
    mark_identity(records)
    verdicts = {(r.case_id, r.mode): r.identical_to_plain for r in records}
    assert verdicts == {("a", "plain"): True, ("a", "ooo"): False,  # None vs "" differ
                        ("b", "plain"): True, ("b", "ooo"): True,
                        ("c", "ooo"): None,
                        ("d", "plain"): True, ("d", "ooo"): False}  # byte-exact arguments


def test_mode_summary_math() -> None:
    summary = summarize(synthetic(), ["plain", "ooo"])
    plain, ooo = summary["modes"]["plain"], summary["modes"]["ooo"]
    assert plain["n"] == 4 and plain["errors"] == 0
    assert plain["outcomes"] == {"disabled": 4}
    assert plain["hit_rate"] == 0
    assert plain["steps_median"] == 25
    assert plain["steps_median_on_hits"] is None
    assert plain["accepted_per_step"] == 0
    assert plain["tokens_per_step"] == 1.0
    assert plain["decode_ms_median"] == 250
    assert plain["e2e_ms_p50"] == 260
    assert plain["e2e_ms_p95"] == pytest.approx(110 + 300 * 0.95)  # between 310 and 410
    assert plain["identical_to_plain"] == 1.0 and plain["accuracy"] == 1.0

    # The warm-up (1000 steps) is ignored; the error counts as an error, not a request.
    assert ooo["n"] == 4 and ooo["errors"] == 1
    assert ooo["error_messages"] == {"HTTP 503: busy": 1}
    assert ooo["hit_rate"] == 0.5
    assert ooo["outcomes"] == {"hit": 2, "miss": 1, "partial": 1}
    assert ooo["steps_median"] == 12  # 2, 4, 20, 30
    assert ooo["steps_median_on_hits"] == 3
    assert ooo["accepted_per_step"] == pytest.approx((8 + 16 + 0 + 20) / 56)
    assert ooo["tokens_per_step"] == pytest.approx(100 / 56)
    assert ooo["decode_ms_median"] == 70  # 20, 40, 100, 300
    assert ooo["candidate_ready_ms_median"] == 62  # 52, 54, 70, 80
    assert ooo["with_candidate"] == 1.0 and plain["with_candidate"] == 0
    # Second in the case's order: c0 (40 ms), c2 (320); first: c1 (60), c3 (120).
    assert ooo["e2e_ms_median_by_position"] == {0: 90, 1: 180}
    assert plain["e2e_ms_median_by_position"] == {0: 260}
    assert ooo["sidecar_ms_median"] == 40
    assert ooo["accuracy"] == 0.75
    assert ooo["identical_to_plain"] == 0.75  # c2's arguments differ


def test_ratios_against_plain() -> None:
    versus = summarize(synthetic(), ["plain", "ooo"])["vs_plain"]["ooo"]
    assert versus["steps_ratio"] == pytest.approx(25 / 12)
    # On the cases ooo hit (c0, c1): plain median 15 steps, ooo median 3.
    assert versus["steps_ratio_on_hits"] == pytest.approx(5.0)
    # Per case: 10/2, 20/4, 30/30, 40/20 -> median of 5, 5, 1, 2 = 3.5.
    assert versus["steps_ratio_paired_median"] == pytest.approx(3.5)
    assert versus["decode_ratio"] == pytest.approx(250 / 70)
    # Per case decode: 100/20, 200/40, 300/300, 400/100 -> 5, 5, 1, 4 -> 4.5.
    assert versus["decode_ratio_paired_median"] == pytest.approx(4.5)
    assert versus["e2e_ratio"] == pytest.approx(260 / 90)  # ooo e2e: 40, 60, 120, 320
    assert versus["candidate_ready_ms_median"] == 62
    assert versus["plain_decode_ms_median"] == 250
    assert versus["candidate_ready_vs_plain_decode"] == pytest.approx(62 / 250)
    assert versus["paired_cases"] == 4


def test_summary_without_plain_has_no_ratios() -> None:
    records = [r for r in synthetic() if r.mode == "ooo"]
    summary = summarize(records, ["ooo"])
    assert "vs_plain" not in summary
    assert "no 'plain' mode" in report.format_summary(summary)


def test_empty_mode_summary() -> None:
    summary = summarize([], ["plain", "ooo"])
    assert summary["modes"]["ooo"]["n"] == 0
    assert summary["modes"]["ooo"]["hit_rate"] is None
    assert summary["vs_plain"]["ooo"]["steps_ratio"] is None
    report.format_summary(summary)  # prints dashes, does not fail


def test_report_writes_json_and_png(tmp_path: Any) -> None:
    records = synthetic()
    dicts = bench.records_as_dicts(records)
    path = report.write_json(tmp_path / "out" / "b.json", {"records": dicts})
    assert json.loads(path.read_text())["records"][0]["mode"] == "plain"
    png = report.plot_latencies(tmp_path / "out" / "b.png", dicts, ["plain", "ooo"], "t")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_latencies(tmp_path / "none.png", [], ["plain"]) is None


# ---------------------------------------------------------------- ngram, agent set, ooo+tools


def agent_case(case_id: str = "agent_x", max_steps: int = 1) -> bench.AgentCase:
    return bench.AgentCase(
        id=case_id, messages=[{"role": "user", "content": "look up 'paris'"}],
        tools=make_case().tools, tool_choice={"type": "function", "function": {"name": "area"}},
        max_steps=max_steps, max_tokens=48,
    )


def test_parse_agent_dataset() -> None:
    assert parse_dataset_spec("bfcl:simple_python,multiple,agent") == [
        DatasetSpec("bfcl", "simple_python"), DatasetSpec("bfcl", "multiple"),
        DatasetSpec("agent", "all")]
    assert parse_dataset_spec("agent:all,agent") == [DatasetSpec("agent", "all")]
    with pytest.raises(ValueError, match="no category"):
        parse_dataset_spec("agent:lookup")


def test_agent_requests_run_the_loop_in_every_mode() -> None:
    settings = RequestSettings(model="m")
    for name in ("plain", "ngram", "ooo", "ooo+tools"):
        kwargs = build_request(agent_case(max_steps=2), MODES[name], settings)
        options = kwargs["extra_body"]["ooo_spec"]
        assert options["execute_tools"] is True and options["max_steps"] == 2
        assert kwargs["tool_choice"] == {"type": "function", "function": {"name": "area"}}
        assert kwargs["max_tokens"] == 48 and "parallel_tool_calls" not in kwargs
        # Only ooo+tools may pre-execute; the registry's extras stay untouched.
        assert options.get("pre_execute", False) is (name == "ooo+tools")
        assert "execute_tools" not in MODES[name].extra_body["ooo_spec"]
    bfcl = build_request(make_case(), MODES["ngram"], settings)
    assert bfcl["extra_body"] == {"ooo_spec": {"enabled": False, "baseline": "ngram",
                                               "history": False,
                                               "diagnostics": {"suffix_scope": "bench:ngram"}}}


def test_plan_runs_ooo_tools_only_on_the_agent_set_and_warms_each_source() -> None:
    modes = parse_modes("plain,ngram,ooo,ooo+tools")
    cases = [make_case("simple_python_0"), make_case("simple_python_1"), agent_case("agent_a")]
    plan = bench.build_plan(cases, modes, warmup=1)
    warm = [(c.id, m.name) for c, m, _, w in plan if w]
    measured = [(c.id, m.name) for c, m, _, w in plan if not w]
    assert sorted(warm) == sorted([("simple_python_0", m) for m in ("plain", "ngram", "ooo")]
                                  + [("agent_a", m.name) for m in modes])
    assert [m for c, m in measured if c == "simple_python_0"] == ["plain", "ngram", "ooo"]
    assert [m for c, m in measured if c == "simple_python_1"] == ["ngram", "ooo", "plain"]
    assert sorted(m for c, m in measured if c == "agent_a") == sorted(m.name for m in modes)
    # Positions are within each case's own order.
    assert {p for c, _, p, w in plan if c.id == "agent_a" and not w} == {0, 1, 2, 3}


class RejectingCompletions(FakeCompletions):
    """A server without the n-gram engine: 400 for `baseline: ngram`."""

    def create(self, **kwargs: Any) -> Any:
        if kwargs["extra_body"]["ooo_spec"].get("baseline") == "ngram":
            exc = RuntimeError("bad request")
            exc.status_code = 400  # type: ignore[attr-defined]
            exc.body = {"message": "baseline 'ngram' is not deployed"}  # type: ignore[attr-defined]
            raise exc
        return super().create(**kwargs)


def test_a_mode_refused_in_warm_up_stops_the_run_at_once() -> None:
    records, stop = run_bench(fake_client(RejectingCompletions()), cases_q(5),
                              parse_modes("plain,ngram"), RequestSettings(model="m"), warmup=1)
    assert stop is not None and "rejected mode 'ngram'" in stop and "not deployed" in stop
    assert [(r.mode, r.warmup) for r in records] == [("plain", True), ("ngram", True)]


def report_response(report_: dict[str, Any], content: str | None = "done") -> Any:
    message = SimpleNamespace(content=content, tool_calls=None)
    return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")],
                           usage=SimpleNamespace(completion_tokens=7),
                           model_extra={"ooo_spec": report_})


def test_record_reads_commit_time_tools_and_baseline() -> None:
    report_ = {
        "enabled": True, "outcome": "hit", "baseline": None, "candidates": [],
        "main": {"steps": 4, "completion_tokens": 30, "drafted_tokens": 20,
                 "accepted_tokens": 26, "ttft_ms": 5.0, "decode_ms": 50.0},
        "tool_results": [{"tool_call_id": "call_1", "name": "area", "content": "50",
                          "speculative": True, "latency_ms": 500.0, "saved_ms": 420.0}],
        "timings_ms": {"total": 900.0, "sidecar": 30.0, "main": 400.0, "tools": 80.0,
                       "first_commit": 310.0},
    }
    record = bench.record_from_response(report_response(report_), agent_case(), "ooo+tools",
                                        0, 950.0)
    assert record.source == "agent" and record.correct is None  # no ground truth
    assert (record.first_commit_ms, record.tools_ms) == (310.0, 80.0)
    assert record.tool_results == [{"name": "area", "content": "50", "speculative": True,
                                    "saved_ms": 420.0}]
    assert record.output() == ("done", (), (("area", "50"),))
    ngram = bench.record_from_response(
        report_response({**report_, "baseline": "ngram", "tool_results": []}), make_case(),
        "ngram", 1, 900.0)
    assert ngram.baseline == "ngram" and ngram.source == "bfcl" and ngram.correct is False


def test_identity_includes_what_the_tools_returned() -> None:
    result = {"name": "area", "content": "50", "speculative": False, "saved_ms": 0.0}
    records = [rec("a", "plain", tool_results=[result]),
               rec("a", "ooo+tools", tool_results=[{**result, "speculative": True,
                                                    "saved_ms": 300.0}]),
               rec("a", "ooo", tool_results=[{**result, "content": "51"}])]
    mark_identity(records)
    # Pre-executed or not, the same result is the same output; a different one is not.
    assert [r.identical_to_plain for r in records] == [True, True, False]


def test_ratios_against_ngram_and_per_source_summaries() -> None:
    records = []
    for i, (plain, ngram, ooo) in enumerate([(40, 24, 8), (30, 20, 6), (50, 30, 10)]):
        for mode, steps in (("plain", plain), ("ngram", ngram), ("ooo", ooo)):
            records.append(rec(f"c{i}", mode, steps=steps, first_commit_ms=steps * 10.0))
    records.append(rec("agent_a", "ooo+tools", source="agent", steps=5,
                       tool_results=[{"name": "k", "content": "v", "speculative": True,
                                      "saved_ms": 400.0}], tools_ms=20.0))
    records.append(rec("agent_a", "plain", source="agent", steps=9,
                       tool_results=[{"name": "k", "content": "v", "speculative": False,
                                      "saved_ms": 0.0}], tools_ms=450.0))
    mark_identity(records)
    by_source = bench.summarize_by_source(records, parse_modes("plain,ngram,ooo,ooo+tools"))
    assert list(by_source) == ["bfcl", "agent"]
    bfcl = by_source["bfcl"]
    assert list(bfcl["modes"]) == ["plain", "ngram", "ooo"]  # ooo+tools: not on BFCL
    assert bfcl["vs_plain"]["ooo"]["steps_ratio"] == 5.0
    assert bfcl["vs_ngram"]["ooo"]["steps_ratio"] == 3.0
    assert bfcl["vs_ngram"]["plain"]["steps_ratio"] == pytest.approx(24 / 40)
    assert bfcl["vs_plain"]["ooo"]["commit_ratio"] == 5.0
    assert bfcl["modes"]["ooo"]["commit_ms_p50"] == 80.0
    agent = by_source["agent"]
    assert agent["modes"]["ngram"]["n"] == 0  # ran on neither: an empty column
    tools = agent["modes"]["ooo+tools"]
    assert tools["tool_results_pre_executed"] == 1.0 and tools["saved_ms_median"] == 400.0
    assert tools["tools_ms_median"] == 20.0 and tools["identical_to_plain"] == 1.0
    assert agent["modes"]["plain"]["tool_results_pre_executed"] == 0.0
    text = report.format_summary(bfcl)
    assert "vs ngram (ngram/mode, >1 = faster)" in text and "3.00x" in text
    assert "committed tool call p50 ms" in text


def test_agreement_compares_the_prediction_with_plains_call() -> None:
    case = make_case()
    name = case.tools[0]["function"]["name"]
    params = case.tools[0]["function"]["parameters"]
    required = list(params.get("required") or [])
    args = {k: 1 for k in required}
    plain = Record(case.id, case.category, "plain", 0,
                   tool_calls=[{"name": name, "arguments": json.dumps(args)}])
    right = Record(case.id, case.category, "sidecar", 1,
                   prediction_calls=[{"name": name, "arguments": args}])
    wrong = Record(case.id, case.category, "sidecar", 1,
                   prediction_calls=[{"name": name, "arguments": {**args, "extra": 2}}])
    late = Record("other", case.category, "sidecar", 1, prediction_calls=[])
    base = Record(case.id, case.category, "sidecar:base", 2,
                  prediction_calls=[{"name": name, "arguments": args}])
    mark_agreement([plain, right, wrong, late, base], [case])
    assert right.agrees_whole is True and right.agrees_required is True
    assert base.agrees_whole is True  # the sidecar without its adapter is measured too
    assert wrong.agrees_whole is False and wrong.agrees_required is True
    assert late.agrees_whole is None  # no plain call to agree with


def test_realign_effect_on_partial_cases() -> None:
    records = [
        Record("a", "c", "ooo", 0, outcome="partial", steps=10, accepted_tokens=20),
        Record("a", "c", "ooo:no-realign", 1, outcome="partial", steps=20, accepted_tokens=10),
        Record("b", "c", "ooo", 0, outcome="hit", steps=5, accepted_tokens=30),
        Record("b", "c", "ooo:no-realign", 1, outcome="hit", steps=5, accepted_tokens=30),
    ]
    effect = realign_effect(records)
    assert effect == {"cases": 1, "accepted_per_pass_realign": 2.0,
                      "accepted_per_pass_no_realign": 0.5}
    assert realign_effect(records[2:]) is None


def test_candidate_ready_time_is_the_sidecars_not_a_history_candidates() -> None:
    report_ = {"enabled": True, "outcome": "hit", "main": {"steps": 2},
               "candidates": [
                   {"source": "history", "name": "area", "arguments": {}, "valid": True,
                    "ready_ms": 0.0},
                   {"source": "sidecar", "name": "area", "arguments": {}, "valid": True,
                    "ready_ms": 640.0}]}
    record = bench.record_from_response(report_response(report_), make_case(), "ooo", 0, 1.0)
    assert record.candidate_ready_ms == 640.0 and record.candidates == 2
    report_["candidates"] = report_["candidates"][:1]
    record = bench.record_from_response(report_response(report_), make_case(), "ooo", 0, 1.0)
    assert record.candidate_ready_ms is None


# ---------------------------------------------------------------- how the bench is started


def test_bench_runs_as_a_module_and_through_the_cli_from_the_repository_root(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """`python -m load_tests.bench` is the bench; `ooo-spec bench` hands it every argument
    (its flags, --help included) without touching sys.path, and says where to run it from."""
    from app import cli

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "load_tests.bench", "--help"], cwd=root,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0 and "--dataset" in done.stdout, done.stderr
    path_before = list(sys.path)
    monkeypatch.chdir(root)
    assert cli.main(["bench", "--help"]) == 0
    assert "python -m load_tests.bench" in capfd.readouterr().out
    assert cli.main(["bench", "--limit", "0"]) == 2  # the bench's own check, not argparse's
    assert "--limit must be at least 1" in capfd.readouterr().err
    assert sys.path == path_before
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "--start"]) == 2
    assert "repository root" in capfd.readouterr().err


# ---------------------------------------------------------------- the auto dataset


def test_parse_auto_datasets() -> None:
    assert parse_dataset_spec("bfcl-auto:simple_python,multiple,agent-auto") == [
        DatasetSpec("bfcl-auto", "simple_python"), DatasetSpec("bfcl-auto", "multiple"),
        DatasetSpec("agent-auto", "all")]
    assert parse_dataset_spec("auto") == [
        DatasetSpec("bfcl-auto", "simple_python"), DatasetSpec("bfcl-auto", "multiple"),
        DatasetSpec("agent-auto", "all")]
    assert parse_dataset_spec("bfcl:simple_python,auto")[0] == DatasetSpec("bfcl",
                                                                            "simple_python")
    with pytest.raises(ValueError, match="no category"):
        parse_dataset_spec("agent-auto:lookup")


def test_auto_cases_ask_with_tool_choice_auto_and_are_their_own_source() -> None:
    settings = RequestSettings(model="m")
    case = bench.AutoCase(make_case())
    kwargs = build_request(case, MODES["ooo"], settings)
    assert kwargs["tool_choice"] == "auto"
    assert kwargs["extra_body"]["ooo_spec"]["history"] is False
    assert case.id == "simple_python_0@auto" and bench.case_source(case) == "bfcl-auto"
    agent = bench.AutoCase(agent_case(max_steps=2))
    kwargs = build_request(agent, MODES["ooo+tools"], settings)
    assert kwargs["tool_choice"] == "auto"
    assert kwargs["extra_body"]["ooo_spec"]["execute_tools"] is True
    assert bench.case_source(agent) == "agent-auto"
    assert MODES["ooo+tools"].applies_to("agent-auto")
    # A text answer is scored (no call: not correct), not an error.
    response = SimpleNamespace(
        choices=[SimpleNamespace(finish_reason="stop", message=SimpleNamespace(
            content="The area is 25.", tool_calls=None))],
        model_extra={"ooo_spec": {"outcome": "no_call", "main": {"steps": 7}}}, usage=None)
    record = bench.record_from_response(response, case, "ooo", 0, 50.0)
    assert record.source == "bfcl-auto" and record.correct is False
    assert record.case_id == "simple_python_0@auto" and record.steps == 7


def test_passes_per_call_count_only_committed_calls() -> None:
    records = [rec("a", "ooo", steps=10), rec("b", "ooo", steps=30, tool_calls=[]),
               rec("c", "ooo", steps=6, tool_calls=[], tool_results=[
                   {"name": "x", "content": "1", "speculative": False, "saved_ms": 0.0}] * 2)]
    summary = bench.mode_summary(records)
    assert summary["steps_per_call"] == 46 / 3
    assert summary["with_call"] == 2 / 3
    assert "main passes / call" in report.format_summary(summarize(records, ["ooo"]))


def test_the_sidecar_line_compares_its_passes_with_plains() -> None:
    call = [{"name": "f", "arguments": "{}"}]
    records = [Record(f"c{i}", "c", "plain", 0, steps=steps, first_commit_ms=steps * 50.0,
                      decode_ms=steps * 40.0, tool_calls=call) for i, steps in enumerate((40, 60))]
    # An answer in prose is not a call the prediction races: its passes are left out.
    records.append(Record("c9", "c", "plain", 0, steps=500, decode_ms=20_000.0))
    records += [Record(f"c{i}", "c", "sidecar", 1, prediction_ready_ms=ms,
                       prediction_passes=passes)
                for i, (ms, passes) in enumerate(((1000.0, 10), (1500.0, 14)))]
    line = next(part for part in report.format_summary(summarize(records, ["plain", "sidecar"]))
                .split("\n\n") if part.startswith("sidecar: prediction ready"))
    # Medians: ready 1,250 ms vs plain's call at 2,500 ms; 12 passes vs plain's 50.
    assert "vs plain's time to its call 2,500 ms: 0.50x" in line
    assert "sidecar passes 12.0 vs plain's 50.0 to its call (medians): 0.24x" in line
    assert report.format_summary(summarize(records, ["plain", "sidecar"])).count(
        "sidecar passes to its prediction (median)") == 1


# ---------------------------------------------------------------- vLLM's suffix decoding


def test_suffix_mode_asks_the_servers_suffix_engine() -> None:
    assert MODES["suffix"].extra_body == {"ooo_spec": {"enabled": False, "baseline": "suffix"}}
    assert MODES["suffix"].sources is None  # every dataset
    assert parse_modes("plain,ngram,suffix,drafts,ooo")[2] is MODES["suffix"]


def test_suffix_mode_is_refused_where_arctic_inference_is_missing(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("app.engine.vllm_suffix.suffix_available", lambda: False)
    refusal = bench.suffix_refusal(parse_modes("plain,suffix"), starts_server=True)
    assert refusal is not None and "arctic-inference" in refusal and "setup.sh" in refusal
    # A server the bench does not start answers for itself; other modes need nothing.
    assert bench.suffix_refusal(parse_modes("plain,suffix"), starts_server=False) is None
    assert bench.suffix_refusal(parse_modes("plain,ngram"), starts_server=True) is None
    # The command stops before it starts anything (no Ray here: it would hang or fail).
    assert bench.main(["--start", "--modes", "plain,suffix", "--limit", "1"]) == 2
    assert "mode suffix refused" in capfd.readouterr().err
    monkeypatch.setattr("app.engine.vllm_suffix.suffix_available", lambda: True)
    assert bench.suffix_refusal(parse_modes("plain,suffix"), starts_server=True) is None


def test_ratios_are_given_against_both_of_vllms_methods() -> None:
    records = [rec("a", "plain", steps=40), rec("a", "ngram", steps=20),
               rec("a", "suffix", steps=16), rec("a", "ooo", steps=8)]
    summary = summarize(records, ["plain", "ngram", "suffix", "ooo"])
    assert summary["vs_suffix"]["ooo"]["steps_ratio"] == 2.0
    assert summary["vs_ngram"]["suffix"]["steps_ratio"] == 1.25
    text = report.format_summary(summary)
    assert "vs suffix (suffix/mode" in text and "vs ngram (ngram/mode" in text


# ---------------------------------------------------------------- BFCL multi-turn replay


def multi_step(conversation: str, index: int) -> Any:
    from load_tests.bfcl_multi import ExpectedCall, MultiTurnStep

    return MultiTurnStep(
        id=f"{conversation}#{index}", category="multi_turn_base", conversation=conversation,
        index=index, turn=index, messages=[{"role": "user", "content": "go"}],
        tools=make_case().tools,
        expected=ExpectedCall(name="area", arguments={"base": 10, "height": 5}))


def test_parse_and_request_the_multi_turn_dataset() -> None:
    assert parse_dataset_spec("bfcl-multi:multi_turn_base,bfcl:simple_python") == [
        DatasetSpec("bfcl-multi", "multi_turn_base"), DatasetSpec("bfcl", "simple_python")]
    with pytest.raises(ValueError, match="multi-turn category"):
        parse_dataset_spec("bfcl-multi:multi_turn_miss_func")
    step = multi_step("c", 1)
    assert bench.case_source(step) == "bfcl-multi"
    kwargs = build_request(step, MODES["ooo"], RequestSettings(model="m"))
    assert kwargs["messages"] == step.messages and kwargs["tool_choice"] == "required"
    # Every mode is asked the same: no call or output remembered from another mode's run.
    assert kwargs["extra_body"]["ooo_spec"]["history"] is False
    assert "suffix" not in kwargs["extra_body"]["ooo_spec"]  # on, in the mode's own index
    assert kwargs["extra_body"]["ooo_spec"]["diagnostics"]["suffix_scope"] == "bench:ooo"
    other = build_request(step, MODES["drafts"], RequestSettings(model="m"))
    assert other["extra_body"]["ooo_spec"]["diagnostics"]["suffix_scope"] == "bench:drafts"


def test_multi_turn_record_knows_its_conversation_and_is_scored() -> None:
    message = SimpleNamespace(content=None, tool_calls=[SimpleNamespace(function=SimpleNamespace(
        name="area", arguments='{"base": 10, "height": 5}'))])
    response = SimpleNamespace(
        choices=[SimpleNamespace(message=message, finish_reason="tool_calls")],
        usage=None, model_extra={"ooo_spec": {"outcome": "disabled", "main": {"steps": 9}}})
    record = bench.record_from_response(response, multi_step("c", 2), "plain", 0, 80.0)
    assert (record.source, record.conversation, record.call_index) == ("bfcl-multi", "c", 2)
    assert record.correct is True and record.case_id == "c#2"


def test_multi_turn_summary_by_position_and_per_conversation() -> None:
    records = []
    # Two conversations of two calls; ooo halves plain's passes on later calls only.
    for conv in ("c0", "c1"):
        for index, (plain, ooo) in enumerate([(20, 20), (40, 20)]):
            records += [rec(f"{conv}#{index}", "plain", steps=plain, e2e_ms=plain * 10.0,
                            source="bfcl-multi", conversation=conv, call_index=index),
                        rec(f"{conv}#{index}", "ooo", steps=ooo, e2e_ms=ooo * 10.0,
                            source="bfcl-multi", conversation=conv, call_index=index)]
    # A conversation ooo did not finish (an error) is not counted as a whole.
    records += [rec("c2#0", "plain", source="bfcl-multi", conversation="c2", call_index=0),
                rec("c2#0", "ooo", source="bfcl-multi", conversation="c2", call_index=0,
                    error="HTTP 500: boom")]
    mark_identity(records)
    summary = bench.summarize_by_source(records, parse_modes("plain,ooo"))["bfcl-multi"]
    multi = summary["multi_turn"]
    assert multi["first_calls"]["vs_plain"]["ooo"]["steps_ratio"] == 1.0
    assert multi["later_calls"]["vs_plain"]["ooo"]["steps_ratio"] == 2.0
    totals = multi["conversations"]
    assert totals["plain"]["conversations"] == 3 and totals["ooo"]["conversations"] == 2
    assert totals["ooo"]["passes_median"] == 40 and totals["ooo"]["calls"] == 4
    assert totals["ooo"]["passes_ratio_paired_median"] == 1.5
    assert totals["ooo"]["e2e_ratio_paired_median"] == 1.5
    assert totals["ooo"]["identical_conversations"] == 1.0
    text = report.format_multi_turn(multi)
    assert "first call of each conversation" in text and "later calls" in text
    assert "main passes / conversation" in text


def test_drafted_and_accepted_tokens_per_source_are_summed_and_printed() -> None:
    tallies = {"sidecar": {"drafted_tokens": 10, "accepted_tokens": 8, "gain_tokens": 3},
               "lookup": {"drafted_tokens": 4, "accepted_tokens": 1, "gain_tokens": 0}}
    response = report_response({"outcome": "hit", "main": {"steps": 5, "sources": tallies}})
    record = bench.record_from_response(response, make_case(), "ooo", 0, 10.0)
    assert record.sources == tallies
    records = [record, bench.record_from_response(response, make_case("b"), "ooo", 0, 10.0),
               rec("a", "plain")]
    summary = summarize(records, ["plain", "ooo"])
    assert summary["modes"]["ooo"]["sources"]["sidecar"] == {
        "drafted_tokens": 20, "accepted_tokens": 16, "gain_tokens": 6}
    assert summary["modes"]["plain"]["sources"] == {}
    text = report.format_summary(summary)
    assert "drafted / accepted tokens by source" in text
    assert "20 / 16 (80%)" in text and "8 / 2 (25%)" in text
    # A server without per-source numbers: no table.
    assert "by source" not in report.format_summary(summarize([rec("a", "plain")], ["plain"]))
