from pathlib import Path

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

