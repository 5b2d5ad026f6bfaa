"""Output of `ooo-spec bench`: the printed tables, the JSON file and the latency plot.

Everything here reads the `summarize` dict and the records of `load_tests.bench`; nothing here
computes a statistic of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Formatter = Callable[[Any], str]


def _num(digits: int = 0, unit: str = "") -> Formatter:
    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:,.{digits}f}{unit}"

    return fmt


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _times(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _by_position(value: Any) -> str:
    if not value:
        return "-"
    return " / ".join("-" if v is None else f"{v:,.0f}" for v in value.values())


def _outcomes(value: Any) -> str:
    if not value:
        return "-"
    return " ".join(f"{k}:{v}" for k, v in value.items())


MODE_ROWS: tuple[tuple[str, str, Formatter], ...] = (
    ("n (ok requests)", "n", _num()),
    ("errors", "errors", _num()),
    ("hit rate", "hit_rate", _pct),
    ("outcomes", "outcomes", _outcomes),
    ("e2e p50 ms", "e2e_ms_p50", _num()),
    ("e2e p95 ms", "e2e_ms_p95", _num()),
    ("committed tool call p50 ms", "commit_ms_p50", _num()),
    ("e2e p50 ms when 1st / 2nd / ...", "e2e_ms_median_by_position", _by_position),
    ("main steps / request (median)", "steps_median", _num(1)),
    ("main steps on hits (median)", "steps_median_on_hits", _num(1)),
    ("answers with a call", "with_call", _pct),
    ("main passes / call", "steps_per_call", _num(1)),
    ("accepted tokens / step", "accepted_per_step", _num(2)),
    ("completion tokens / step", "tokens_per_step", _num(2)),
    ("decode ms (median)", "decode_ms_median", _num()),
    ("ttft ms (median)", "ttft_ms_median", _num()),
    ("sidecar ms (median)", "sidecar_ms_median", _num()),
    ("requests with a candidate", "with_candidate", _pct),
    ("sidecar candidate ready ms (median)", "candidate_ready_ms_median", _num()),
    ("tool wait after commit ms (median)", "tools_ms_median", _num()),
    ("tool results pre-executed", "tool_results_pre_executed", _pct),
    ("tool time saved ms (median)", "saved_ms_median", _num()),
    ("sidecar prediction ready ms (median)", "prediction_ready_ms_median", _num()),
    ("sidecar passes to its prediction (median)", "prediction_passes_median", _num(1)),
    ("agrees with plain: whole call", "agreement_whole", _pct),
    ("agrees with plain: required args", "agreement_required", _pct),
    ("BFCL accuracy", "accuracy", _pct),
    ("identical to plain", "identical_to_plain", _pct),
)

RATIO_ROWS: tuple[tuple[str, str, Formatter], ...] = (
    ("steps ratio (median/median)", "steps_ratio", _times),
    ("steps ratio on hits (same cases)", "steps_ratio_on_hits", _times),
    ("steps ratio (per-case median)", "steps_ratio_paired_median", _times),
    ("decode ratio (median/median)", "decode_ratio", _times),
    ("decode ratio (per-case median)", "decode_ratio_paired_median", _times),
    ("e2e ratio (median/median)", "e2e_ratio", _times),
    ("e2e ratio (per-case median)", "e2e_ratio_paired_median", _times),
    ("committed call ratio (median/median)", "commit_ratio", _times),
    ("committed call ratio (per-case median)", "commit_ratio_paired_median", _times),
    ("paired cases", "paired_cases", _num()),
)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header, *rows]):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                         strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(
    summary: Mapping[str, Any], baseline: str = "plain",
    peer: str | Sequence[str] | None = ("ngram", "suffix"),
) -> str:
    """The per-mode table, then the ratios against the baseline and against each peer that
    ran (reference / mode: >1 = the mode is faster), then candidate-ready vs plain decode."""
    peers = [peer] if isinstance(peer, str) else list(peer or ())
    modes = list(summary["modes"])
    per_mode = summary["modes"]
    parts = [
        _table(
            ["per mode", *modes],
            [[label] + [fmt(per_mode[m].get(key)) for m in modes] for label, key, fmt in MODE_ROWS],
        )
    ]
    versus = summary.get(f"vs_{baseline}") or {}
    others = list(versus)
    for reference in dict.fromkeys([baseline, *peers]):
        against = summary.get(f"vs_{reference}") or {}
        if against:
            parts.append(
                _table(
                    [f"vs {reference} ({reference}/mode, >1 = faster)", *against],
                    [[label] + [fmt(against[m].get(key)) for m in against]
                     for label, key, fmt in RATIO_ROWS],
                )
            )
    if others:
        lines = []
        for m in others:
            v = versus[m]
            if not per_mode[m].get("with_candidate"):
                continue  # plain decoding or the n-gram engine: no sidecar candidates
            lines.append(
                f"{m}: sidecar candidate ready at {_num(0, ' ms')(v['candidate_ready_ms_median'])}"
                f" (median over the requests it reached in time; "
                f"{_pct(per_mode[m].get('with_candidate'))} had any candidate) vs {baseline}"
                f" decode {_num(0, ' ms')(v['plain_decode_ms_median'])}"
                f" (median): {_times(v['candidate_ready_vs_plain_decode'])} of it"
            )
        if lines:
            parts.append("\n".join(lines))
    elif baseline not in per_mode:
        parts.append(f"(no '{baseline}' mode in this run: no ratios, no identity check)")
    for name, sidecar in per_mode.items():
        if not name.startswith("sidecar") or baseline not in per_mode:
            continue
        ready = sidecar.get("prediction_ready_ms_median")
        decode = per_mode[baseline].get("decode_ms_median")
        # The sidecar's time includes its prompt's prefill: the main model's time to the call
        # (prefill + decode, from the same start) is the like-for-like comparison.
        to_call = per_mode[baseline].get("first_commit_ms_median")
        # Where a pass costs the same whatever it holds, passes are the readiness (see
        # Prediction.passes).
        passes = sidecar.get("prediction_passes_median")
        # The answers without a call (prose, however long) are not what a prediction races.
        steps = per_mode[baseline].get("steps_median_with_call")
        parts.append(
            f"{name}: prediction ready {_num(0, ' ms')(ready)} (median, from the fan-out) vs "
            f"{baseline} decode {_num(0, ' ms')(decode)}: {_times(ratio_of(ready, decode))} of "
            f"it; vs {baseline}'s time to its call {_num(0, ' ms')(to_call)}: "
            f"{_times(ratio_of(ready, to_call))} of it; sidecar passes "
            f"{_num(1)(passes)} vs {baseline}'s {_num(1)(steps)} to its call (medians): "
            f"{_times(ratio_of(passes, steps))}; agrees with {baseline}'s call on "
            f"{_pct(sidecar.get('agreement_whole'))} "
            f"(whole call), {_pct(sidecar.get('agreement_required'))} (required arguments) "
            f"of {sidecar.get('agreement_cases')} cases where {baseline} committed a call"
        )
    realign = summary.get("realign")
    if realign:
        parts.append(
            f"re-alignment, on the {realign['cases']} cases where ooo's candidate was partly "
            f"right: accepted tokens per main forward pass "
            f"{_num(2)(realign['accepted_per_pass_realign'])} with, "
            f"{_num(2)(realign['accepted_per_pass_no_realign'])} without"
        )
    sources = format_sources(per_mode)
    if sources:
        parts.append(sources)
    errors = {m: s["error_messages"] for m, s in per_mode.items() if s.get("error_messages")}
    if errors:
        parts.append(
            "errors:\n"
            + "\n".join(
                f"  {m}: {count}x {message}"
                for m, messages in errors.items()
                for message, count in messages.items()
            )
        )
    return "\n\n".join(parts)


def ratio_of(numerator: Any, denominator: Any) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return path


def plot_latencies(
    path: Path, records: Sequence[Mapping[str, Any]], modes: Sequence[str], title: str = ""
) -> Path | None:
    """ECDF and box plot of end-to-end latency per mode (measured, successful requests).
    Returns None when there is nothing to plot."""
    data = {
        m: sorted(r["e2e_ms"] for r in records
                  if r["mode"] == m and not r["warmup"] and r["error"] is None)
        for m in modes
    }
    data = {m: v for m, v in data.items() if v}
    if not data:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ecdf, box) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m, values in data.items():
        n = len(values)
        ecdf.step(values, [(i + 1) / n for i in range(n)], where="post", label=f"{m} (n={n})")
    ecdf.set_xlabel("end-to-end latency (ms)")
    ecdf.set_ylabel("share of requests")
    ecdf.set_title("latency ECDF")
    ecdf.grid(alpha=0.3)
    ecdf.legend()
    box.boxplot(list(data.values()), tick_labels=list(data), showmeans=True)
    box.set_ylabel("end-to-end latency (ms)")
    box.set_title("latency per mode")
    box.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


CONVERSATION_ROWS: tuple[tuple[str, str, Formatter], ...] = (
    ("conversations answered completely", "conversations", _num()),
    ("calls in them", "calls", _num()),
    ("main passes / conversation (median)", "passes_median", _num(1)),
    ("e2e ms / conversation (median)", "e2e_ms_median", _num()),
    ("passes ratio vs plain (per-conv. median)", "passes_ratio_paired_median", _times),
    ("e2e ratio vs plain (per-conv. median)", "e2e_ratio_paired_median", _times),
    ("conversations identical to plain", "identical_conversations", _pct),
)


def format_multi_turn(
    multi: Mapping[str, Any], baseline: str = "plain",
    peer: str | Sequence[str] | None = ("ngram", "suffix"),
) -> str:
    """The replayed conversations (bench `multi_turn_summary`): first calls and later calls
    apart, then the per-conversation totals."""
    parts = [
        "--- first call of each conversation ---",
        format_summary(multi["first_calls"], baseline, peer),
        "--- later calls (after the conversation's earlier calls and their results) ---",
        format_summary(multi["later_calls"], baseline, peer),
    ]
    totals = multi["conversations"]
    modes = list(totals)
    parts.append(_table(
        ["per conversation", *modes],
        [[label] + [fmt(totals[m].get(key)) for m in modes]
         for label, key, fmt in CONVERSATION_ROWS],
    ))
    return "\n\n".join(parts)


def format_sources(per_mode: Mapping[str, Any]) -> str | None:
    """Drafted / accepted tokens per draft source and mode (`ooo_spec.main.sources`), with
    accepted per drafted; None when no mode reported sources."""
    modes = [m for m, s in per_mode.items() if s.get("sources")]
    if not modes:
        return None
    names = list(dict.fromkeys(n for m in modes for n in per_mode[m]["sources"]))

    def cell(tally: Mapping[str, int] | None) -> str:
        if not tally:
            return "-"
        drafted, accepted = tally.get("drafted_tokens", 0), tally.get("accepted_tokens", 0)
        rate = f" ({100 * accepted / drafted:.0f}%)" if drafted else ""
        return f"{drafted:,} / {accepted:,}{rate}"

    return _table(
        ["drafted / accepted tokens by source", *modes],
        [[name] + [cell(per_mode[m]["sources"].get(name)) for m in modes] for name in names],
    )
