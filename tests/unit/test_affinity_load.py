"""The cache-affinity load test's logic (load_tests/affinity.py): conversations per user, the
config of each routing mode, and what is counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deployments.local import load_serve_config
from load_tests.affinity import (
    Sample,
    build_parser,
    format_table,
    same_answers,
    serve_config,
    summarize,
    user_conversations,
)
from load_tests.bfcl_multi import ExpectedCall, MultiTurnStep

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "local-autoscale.yaml"


def step(conversation: str, index: int) -> MultiTurnStep:
    return MultiTurnStep(id=f"{conversation}#{index}", category="multi_turn_base",
                         conversation=conversation, index=index, turn=index,
                         messages=[{"role": "user", "content": "hi"}], tools=[],
                         expected=ExpectedCall(name="f", arguments={}))


def test_each_user_replays_one_conversation_in_order_cut_to_its_steps() -> None:
    steps = [step("b", 1), step("a", 0), step("b", 0), step("a", 2), step("a", 1)]
    [b, a] = user_conversations(steps, users=2, max_steps=2)  # in the order they come
    assert [s.id for s in a] == ["a#0", "a#1"] and [s.id for s in b] == ["b#0", "b#1"]
    with pytest.raises(ValueError):
        user_conversations(steps, users=3, max_steps=2)


def test_the_modes_differ_only_in_the_request_router() -> None:
    base = load_serve_config(CONFIG)
    on, off = (serve_config(base, routing, users=3, port=9000) for routing in
               ("affinity", "serve"))

    def main(config: dict[str, Any]) -> dict[str, Any]:
        (app,) = config["applications"]
        [entry] = [d for d in app["deployments"] if d["name"] == "MainModel"]
        return entry

    assert "request_router_config" in main(on) and "request_router_config" not in main(off)
    main(on).pop("request_router_config")
    assert on == off
    scaling = main(off)["autoscaling_config"]
    assert scaling["min_replicas"] == scaling["max_replicas"] == 2
    (app,) = off["applications"]
    assert len(app["args"]["auth"]["api_keys"]) == 3  # one tenant per user
    assert app["args"]["main"]["engine"]["max_model_len"] == 8192
    assert off["http_options"]["port"] == 9000


def sample(user: int, step: int, replica: str, cached: int, answer: str = "x",
           error: str | None = None) -> Sample:
    return Sample("affinity", user, step, replica, cached, 100, 50.0 + step, 90.0 + step,
                  answer, error)


def test_summary_counts_follow_ups_on_their_previous_replica_and_the_cached_share() -> None:
    samples = [sample(0, 0, "r1", 0), sample(0, 1, "r1", 80), sample(0, 2, "r2", 0),
               sample(1, 0, "r2", 0), sample(1, 1, "r2", 60),
               sample(1, 2, "r2", 0, error="HTTP 503")]
    summary = summarize(samples)
    assert summary["follow_ups"] == 3 and summary["follow_ups_on_previous_replica"] == 2
    assert summary["follow_up_cached_share"] == pytest.approx(140 / 300)
    assert summary["requests_per_replica"] == [3, 2] and summary["errors"] == 1
    assert summary["first_ttft_ms_p50"] == 50.0 and summary["follow_up_e2e_ms_p50"] == 91.0
    assert summary["follow_up_ttft_ms_mean"] == pytest.approx((51 + 52 + 51) / 3)
    assert "2/3" in format_table({"affinity": summary})


def test_answers_must_match_across_modes() -> None:
    same = [sample(0, 0, "r1", 0), sample(0, 0, "r2", 0)]
    assert same_answers(same)
    assert not same_answers([*same, sample(0, 0, "r1", 0, answer="y")])


def test_help_lists_the_routings_and_categories() -> None:
    text = build_parser().format_help()
    assert "affinity" in text and "serve" in text and "multi_turn_base" in text
