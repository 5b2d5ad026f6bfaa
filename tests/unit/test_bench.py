"""The benchmark harness without a server (load_tests.bench, load_tests.report): mode registry,
dataset specs, request building, the interleaved run against a fake client, and the summary
math on synthetic records."""

from __future__ import annotations

import json
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
    mark_identity,
    mode_order,
    parse_dataset_spec,
    parse_modes,
    percentile,
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
    assert MODES["ooo"].extra_body == {"ooo_spec": {"enabled": True}}


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
    assert kwargs["extra_body"] == {"ooo_spec": {"enabled": False}}
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
