"""The soak's requests and verdicts (load_tests/soak.py): every bad request it sends is one the
server's own checks reject with the status the soak expects, every good one passes them."""

from __future__ import annotations

import json
import random

import pytest

from app.api.errors import ApiError
from app.api.request_checks import parse_request
from app.config import AppConfig
from load_tests.soak import (
    Outcome,
    Probe,
    RssSeries,
    bad_probes,
    good_probes,
    judge,
    percentile,
    rss_problems,
    summarize,
)

CONFIG = AppConfig()
# Rejected further in (router model check, main model context, routing), not by parse_request.
LATER = {"unknown_model", "context_too_long", "stream_context_too_long", "unknown_route",
         "wrong_method"}


def parse(body: bytes) -> object:
    return parse_request(body, CONFIG.router.max_body_bytes, CONFIG.limits,
                         CONFIG.main.engine.max_model_len)


@pytest.mark.parametrize("seed", range(3))
def test_good_probes_pass_the_request_checks(seed: int) -> None:
    for probe in good_probes(random.Random(seed)):
        assert probe.good and probe.expect == 200
        parse(probe.body)


@pytest.mark.parametrize("probe", bad_probes(random.Random(0)), ids=lambda p: p.kind)
def test_bad_probes_are_rejected_with_the_expected_status(probe: Probe) -> None:
    assert not probe.good and 400 <= probe.expect < 500
    if probe.kind in LATER:
        return
    with pytest.raises(ApiError) as caught:
        parse(probe.body)
    assert caught.value.status == probe.expect, caught.value.message


def test_later_bad_probes_are_valid_requests_until_then() -> None:
    for probe in bad_probes(random.Random(0)):
        if probe.kind in {"unknown_model", "context_too_long", "stream_context_too_long"}:
            parse(probe.body)


def test_judge() -> None:
    good = Probe("tool_ooo", True, 200)
    completion = json.dumps({"object": "chat.completion", "ooo_spec": {}})
    assert judge(good, 200, completion) is None
    assert "503" in (judge(good, 503, '{"error": {}}') or "")
    assert "no answer" in (judge(good, 0, "ReadTimeout") or "")
    stream = Probe("tool_stream", True, 200, stream=True)
    assert judge(stream, 200, 'data: {"choices": []}\n\ndata: [DONE]\n\n') is None
    assert "in-band" in (judge(stream, 200, 'data: {"error": {"message": "x"}}\n\n'
                               'data: [DONE]\n\n') or "")
    assert "[DONE]" in (judge(stream, 200, 'data: {"choices": []}\n\n') or "")
    bad = Probe("n_too_many", False, 400)
    envelope = json.dumps({"error": {"message": "only n=1", "type": "x", "param": None,
                                     "code": None}})
    assert judge(bad, 400, envelope) is None
    assert "expected 400" in (judge(bad, 500, envelope) or "")
    assert "expected 400" in (judge(bad, 200, completion) or "")
    assert "envelope" in (judge(bad, 400, '{"detail": "x"}') or "")


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50 and percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100 and percentile([], 0.5) == 0.0
    assert percentile([7.0], 0.99) == 7.0


def test_rss_growth_is_measured_from_the_end_of_the_warmup() -> None:
    mib = 1 << 20
    steady = RssSeries("Router", 1, [(0, 100 * mib), (30, 300 * mib), (60, 310 * mib),
                                     (120, 330 * mib), (300, 320 * mib)])
    leaking = RssSeries("MainModel", 2, [(0, 900 * mib), (60, 1000 * mib), (300, 1400 * mib)])
    summaries = [steady.summary(60), leaking.summary(60)]
    assert summaries[0]["growth_mib"] == 20 and summaries[0]["start_mib"] == 100
    assert summaries[1]["growth_mib"] == 400 and summaries[1]["max_mib"] == 1400
    problems = rss_problems(summaries, 256)
    assert len(problems) == 1 and "MainModel" in problems[0]
    assert RssSeries("Sidecar", 3).summary(60)["samples"] == 0


def test_summarize_counts_what_the_closing_note_reports() -> None:
    outcomes = [
        Outcome("tool_ooo", True, 200, 100.0),
        Outcome("tool_ooo", True, 503, 50.0, "good request answered 503"),
        Outcome("n_too_many", False, 400, 5.0),
        Outcome("body_too_large", False, 413, 8.0),
        Outcome("text", True, 0, 180_000.0, "no answer"),
    ]
    summary = summarize(outcomes, 10.0)
    assert (summary["requests"], summary["good"], summary["bad"]) == (5, 3, 2)
    assert (summary["good_5xx"], summary["good_failed"], summary["bad_4xx"]) == (1, 2, 2)
    assert (summary["all_4xx"], summary["all_5xx"], summary["no_answer"]) == (2, 1, 1)
