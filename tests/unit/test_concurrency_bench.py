from pathlib import Path
from typing import Any

import pytest

from load_tests import agent_replay, concurrency
from load_tests.bench.modes import MODES
from load_tests.bfcl_multi import ExpectedCall, MultiTurnStep
from load_tests.concurrency import (
    Block,
    Sample,
    block_order,
    dashboard_headers,
    format_table,
    plot,
    versus_plain,
)


def _block(mode: str, users: int, latencies: list[float], errors: int = 0) -> Block:
    block = Block(mode, users, duration_s=10.0)
    block.samples = [Sample(mode, users, float(i), ms, 20, 8) for i, ms in enumerate(latencies)]
    block.samples += [Sample(mode, users, 0.0, 1.0, 0, None, "HTTP 503")] * errors
    return block


def test_modes_alternate_their_order_per_level() -> None:
    assert block_order([1, 4, 16]) == [(1, "plain"), (1, "ooo"), (4, "ooo"), (4, "plain"),
                                       (16, "plain"), (16, "ooo")]


def test_summary_counts_only_finished_requests() -> None:
    summary = _block("ooo", 4, [100, 200, 300, 400], errors=2).summary()
    assert summary["finished"] == 4 and summary["errors"] == 2
    assert summary["requests_per_s"] == 0.4
    assert summary["tokens_per_s"] == 8.0
    assert summary["p50_ms"] == 250
    assert summary["p95_ms"] == 400


def test_rates_count_the_wait_for_the_last_answers() -> None:
    """A block that ran 10 s and then waited 10 s more for its last requests did its work in
    20 s: a slower mode must not look as fast because its answers came after the bell."""
    block = _block("ooo", 4, [100, 200, 300, 400])
    block.elapsed_s = 20.0
    summary = block.summary()
    assert summary["requests_per_s"] == 0.2 and summary["tokens_per_s"] == 4.0


def test_versus_plain_and_table() -> None:
    summaries = [_block("plain", 1, [300, 300]).summary(), _block("ooo", 1, [100] * 6).summary()]
    (row,) = versus_plain(summaries)
    assert round(row["throughput_ratio"], 6) == 3.0 and row["p50_speedup"] == 3.0
    table = format_table(summaries)
    assert table.splitlines()[2].startswith("| 1 | plain | 2 |")


def test_plot_has_latency_and_replicas(tmp_path: Path) -> None:
    blocks = [_block("plain", 1, [300, 320]), _block("ooo", 1, [100, 90])]
    result = {"summaries": [b.summary() for b in blocks],
              "samples": [s.__dict__ for b in blocks for s in b.samples],
              "replicas": [{"t_s": 0.0, "replicas": {"MainModel": 1}},
                           {"t_s": 5.0, "replicas": {"MainModel": 2}}]}
    path = plot(tmp_path / "c.png", result)
    assert path.stat().st_size > 10_000


def test_dashboard_token_from_env_then_file_then_home(tmp_path: Path) -> None:
    """Ray's dashboard answers 401 without its token once Ray enables token auth (issue #21)."""
    home = tmp_path / "home"
    assert dashboard_headers({}, home) == {}
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    assert dashboard_headers({}, home) == {"Authorization": "Bearer from-home"}
    named = tmp_path / "token"
    named.write_text("from-path")
    assert dashboard_headers({"RAY_AUTH_TOKEN_PATH": str(named)}, home) == {
        "Authorization": "Bearer from-path"}
    assert dashboard_headers({"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(named)},
                             home) == {"Authorization": "Bearer from-env"}



# ----- several agents at once: the multi-turn replay (load_tests/agent_replay.py) -----------

def _step(conversation: str, index: int) -> MultiTurnStep:
    return MultiTurnStep(id=f"{conversation}#{index}", category="multi_turn_base",
                         conversation=conversation, index=index, turn=0,
                         messages=[{"role": "user", "content": "go"}], tools=[],
                         expected=ExpectedCall(name="f", arguments={}))


def _sample(mode: str, step: str, answer: str = "a", agents: int = 4, e2e: float = 100.0,
            ttft: float | None = 10.0, passes: int | None = 5, tokens: int = 20,
            error: str | None = None) -> agent_replay.Sample:
    return agent_replay.Sample(agents, mode, 0, step, 0.0, e2e, ttft, tokens, passes, answer,
                               error)


def test_every_level_deals_the_same_conversations_each_in_order() -> None:
    steps = [_step(c, i) for c in "abcde" for i in (2, 0, 1)]
    one = agent_replay.agent_conversations(steps, 1, 4)
    four = agent_replay.agent_conversations(steps, 4, 4, max_steps=2)
    assert [s.id for s in one[0]][:3] == ["a#0", "a#1", "a#2"]
    assert sorted(s.id for s in one[0]) == sorted(s.id for s in steps if s.conversation < "e")
    assert [[s.id for s in agent] for agent in four] == [
        ["a#0", "a#1"], ["b#0", "b#1"], ["c#0", "c#1"], ["d#0", "d#1"]]
    with pytest.raises(ValueError, match="3 conversations for 4 agents"):
        agent_replay.agent_conversations(steps, 4, 3)


def test_the_warm_up_step_is_outside_the_replayed_conversations() -> None:
    steps = [_step(c, i) for c in "abc" for i in (1, 0)]
    dealt = agent_replay.agent_conversations(steps, 2, 2)
    warm = agent_replay.warmup_step(steps, 2)
    assert warm.id == "c#0"
    assert warm.conversation not in {s.conversation for agent in dealt for s in agent}
    with pytest.raises(ValueError, match="beyond the 3 replayed"):
        agent_replay.warmup_step(steps, 3)


async def test_each_mode_warms_up_once_under_its_own_tenant_before_the_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str | None, int, str, list[str]]] = []

    async def agent(url: str, key: str | None, agent: int, steps: Any, mode: Any,
                    agents: int, *rest: Any) -> None:
        sent.append((key, agent, mode.name, [s.id for s in steps]))

    monkeypatch.setattr(agent_replay, "_agent", agent)
    steps = [_step(c, 0) for c in "abc"]
    modes = [MODES["suffix"], MODES["ooo"]]
    await agent_replay.run("http://x", [1], modes, steps, 2, None, ["k0"], 8, 1.0,
                           say=lambda _: None, warmup_key="warm")
    assert sent[:2] == [("warm", -1, "suffix", ["c#0"]), ("warm", -1, "ooo", ["c#0"])]
    assert {key for key, *_ in sent[2:]} == {"k0"} and len(sent) == 4
    sent.clear()
    await agent_replay.run("http://x", [1], modes, steps, 2, None, ["k0"], 8, 1.0,
                           say=lambda _: None)
    assert "warm" not in {key for key, *_ in sent}


def test_modes_rotate_from_level_to_level() -> None:
    order = agent_replay.block_order([1, 4, 16], ["plain", "suffix", "ooo"])
    firsts = [order[i][1] for i in (0, 3, 6)]
    assert firsts == ["plain", "suffix", "ooo"]
    assert [agents for agents, _ in order] == [1] * 3 + [4] * 3 + [16] * 3


def test_a_request_selects_its_mode_with_its_own_suffix_memory() -> None:
    body = agent_replay.request_body(_step("a", 0), MODES["drafts"], 64)
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ooo_spec"]["sidecar"] is False and body["ooo_spec"]["history"] is False
    assert body["ooo_spec"]["diagnostics"]["suffix_scope"] == "agents:drafts"
    assert MODES["drafts"].extra_body["ooo_spec"].get("diagnostics") is None  # not mutated
    suffix = agent_replay.request_body(_step("a", 0), MODES["suffix"], 64)
    assert suffix["ooo_spec"]["baseline"] == "suffix"


def test_the_stream_joins_to_its_answer_and_marks_the_first_output() -> None:
    state = agent_replay.StreamState()
    chunks: list[dict[str, Any]] = [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "ls"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": '{"a": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": "1}"}}]}}]},
        {"choices": [], "usage": {"completion_tokens": 7}},
        {"choices": [], "ooo_spec": {"main": {"steps": 3}}},
    ]
    firsts = [state.add(chunk) for chunk in chunks]
    assert firsts == [False, True, False, False, False, False]
    assert state.usage == {"completion_tokens": 7} and state.report == {"main": {"steps": 3}}
    other = agent_replay.StreamState()
    other.add({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
        "name": "ls", "arguments": '{"a":1}'}}]}}]})
    assert state.answer() == other.answer()  # the same call, however the stream split it


def test_summary_rates_latencies_and_tokens_per_pass() -> None:
    samples = [_sample("ooo", f"a#{i}", e2e=100.0 * (i + 1), ttft=10.0 * (i + 1))
               for i in range(4)]
    samples.append(_sample("ooo", "a#9", error="HTTP 503"))
    summary = agent_replay.summarize(samples, elapsed_s=2.0)
    assert (summary["agents"], summary["mode"]) == (4, "ooo")
    assert summary["requests"] == 4 and summary["errors"] == 1
    assert summary["requests_per_s"] == 2.0
    assert summary["e2e_p50_ms"] == 250.0 and summary["e2e_p95_ms"] == 400.0
    assert summary["ttft_p50_ms"] == 25.0
    assert summary["passes"] == 20 and summary["tokens_per_pass"] == 4.0


def test_differences_count_answers_unlike_plains_at_the_same_level() -> None:
    samples = [_sample("plain", "a#0", "x"), _sample("plain", "a#1", "y"),
               _sample("ooo", "a#0", "x"), _sample("ooo", "a#1", "z"),
               _sample("suffix", "a#0", "x"), _sample("suffix", "a#1", "", error="HTTP 503"),
               _sample("ooo", "a#0", "other level", agents=1)]
    diffs = agent_replay.differences(samples)
    assert diffs == {(4, "plain"): 0, (4, "ooo"): 1, (4, "suffix"): 0, (1, "ooo"): 0}
    table = agent_replay.format_table(
        [agent_replay.summarize([s for s in samples if s.mode == "ooo" and s.agents == 4], 1.0)],
        diffs)
    assert table.splitlines()[2].endswith("| 1 |")


def test_api_keys_one_tenant_per_agent(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k1\nk2\n\n")
    assert concurrency.api_keys(f"@{keys}", 2) == ["k1", "k2"]
    assert concurrency.api_keys(None, 16) == [None]
    with pytest.raises(ValueError, match="one tenant per agent"):
        concurrency.api_keys("k1,k2", 4)
