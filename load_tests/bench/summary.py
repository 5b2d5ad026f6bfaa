"""The statistics: pure functions of the records, per mode and against the baselines, per
dataset source and per replayed conversation (`load_tests/report.py` prints and plots them)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from load_tests.bench.datasets import BFCL_MULTI
from load_tests.bench.modes import BASELINE, PEERS, Mode
from load_tests.bench.records import Record


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's
    default); None for no values."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def median(values: Iterable[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return float(statistics.median(data)) if data else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def share(flags: Iterable[bool | None]) -> float | None:
    data = [bool(f) for f in flags if f is not None]
    return sum(data) / len(data) if data else None


def mode_summary(records: Sequence[Record]) -> dict[str, Any]:
    """Statistics of one mode's measured (non-warm-up) records."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    hits = [r for r in ok if r.outcome == "hit"]
    e2e = [r.e2e_ms for r in ok]
    total_steps = sum(r.steps or 0 for r in ok)
    # Calls the answers committed (the agent loop runs them on the server: its results).
    calls = sum(len(r.tool_calls) or len(r.tool_results) for r in ok)
    return {
        "n": len(ok),
        "errors": len(measured) - len(ok),
        "error_messages": dict(Counter(r.error for r in measured if r.error)),
        "hit_rate": len(hits) / len(ok) if ok else None,
        "outcomes": dict(Counter(r.outcome or "?" for r in ok).most_common()),
        "e2e_ms_p50": percentile(e2e, 50),
        "e2e_ms_p95": percentile(e2e, 95),
        "e2e_ms_mean": statistics.fmean(e2e) if e2e else None,
        "commit_ms_p50": percentile([r.first_commit_ms for r in ok
                                     if r.first_commit_ms is not None], 50),
        "tools_ms_median": median(r.tools_ms for r in ok if r.tool_results),
        "tool_results_pre_executed": share(t["speculative"] for r in ok for t in r.tool_results),
        "saved_ms_median": median(sum(t["saved_ms"] or 0.0 for t in r.tool_results)
                                  for r in ok if r.tool_results),
        "steps_median": median(r.steps for r in ok),
        # A forced call is the whole output: passes to the call, what a prediction races.
        "steps_median_with_call": median(r.steps for r in ok if r.tool_calls or r.tool_results),
        # `auto` mode: the model may answer in text; passes per committed call compare modes
        # whatever the mix.
        "with_call": share(bool(r.tool_calls or r.tool_results) for r in ok),
        "steps_per_call": total_steps / calls if calls else None,
        "steps_median_on_hits": median(r.steps for r in hits),
        "accepted_per_step": (
            sum(r.accepted_tokens or 0 for r in ok) / total_steps if total_steps else None
        ),
        "tokens_per_step": (
            sum(r.completion_tokens or 0 for r in ok) / total_steps if total_steps else None
        ),
        "decode_ms_median": median(r.decode_ms for r in ok),
        "first_commit_ms_median": median(r.first_commit_ms for r in ok),
        "ttft_ms_median": median(r.ttft_ms for r in ok),
        "sidecar_ms_median": median(r.sidecar_ms for r in ok if r.sidecar_ms),
        # Only requests that got a candidate before the main model finished have a ready
        # time, so read it together with the share that had one.
        "with_candidate": len([r for r in ok if r.candidates]) / len(ok) if ok else None,
        "candidate_ready_ms_median": median(r.candidate_ready_ms for r in ok),
        # Position in the case's rotated mode order: a gap between positions is the warm/cold
        # bias that the rotation cancels out of the overall numbers.
        "e2e_ms_median_by_position": {
            p: median(r.e2e_ms for r in ok if r.position == p)
            for p in sorted({r.position for r in ok})
        },
        "prediction_ready_ms_median": median(r.prediction_ready_ms for r in ok),
        "prediction_passes_median": median(r.prediction_passes for r in ok),
        "agreement_whole": share(r.agrees_whole for r in ok),
        "agreement_required": share(r.agrees_required for r in ok),
        "agreement_cases": len([r for r in ok if r.agrees_whole is not None]),
        "accuracy": share(r.correct for r in ok),
        "identical_to_plain": share(r.identical_to_plain for r in ok),
        "sources": source_totals(ok),
    }


def source_totals(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """Drafted, accepted and gained tokens per draft source, summed over the records (empty
    when none reported them)."""
    totals: dict[str, dict[str, int]] = {}
    for r in records:
        for name, tally in r.sources.items():
            into = totals.setdefault(name, {})
            for key, value in tally.items():
                into[key] = into.get(key, 0) + value
    return totals


def _paired(
    base: Mapping[str, Record], other: Sequence[Record], attr: str
) -> list[tuple[float, float]]:
    pairs = []
    for r in other:
        b = base.get(r.case_id)
        if b is None:
            continue
        x, y = getattr(b, attr), getattr(r, attr)
        if x is not None and y is not None:
            pairs.append((float(x), float(y)))
    return pairs


def paired_ratio_median(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Median over cases of baseline / mode (cases where the mode value is 0 are skipped)."""
    return median(b / m for b, m in pairs if m)


def versus_baseline(
    baseline: Sequence[Record], records: Sequence[Record]
) -> dict[str, Any]:
    """Speed-ups of one mode over the baseline: ratios are baseline / mode (>1 = faster)."""
    base = {r.case_id: r for r in baseline if r.ok and not r.warmup}
    ok = [r for r in records if r.ok and not r.warmup]
    hits = [r for r in ok if r.outcome == "hit"]
    base_decode = median(r.decode_ms for r in base.values())
    mode_decode = median(r.decode_ms for r in ok)
    ready = median(r.candidate_ready_ms for r in ok)
    hit_steps = _paired(base, hits, "steps")
    return {
        "steps_ratio": ratio(median(r.steps for r in base.values()), median(r.steps for r in ok)),
        "steps_ratio_on_hits": ratio(median(b for b, _ in hit_steps),
                                     median(m for _, m in hit_steps)),
        "steps_ratio_paired_median": paired_ratio_median(_paired(base, ok, "steps")),
        "decode_ratio": ratio(base_decode, mode_decode),
        "decode_ratio_paired_median": paired_ratio_median(_paired(base, ok, "decode_ms")),
        "e2e_ratio": ratio(median(r.e2e_ms for r in base.values()), median(r.e2e_ms for r in ok)),
        "e2e_ratio_paired_median": paired_ratio_median(_paired(base, ok, "e2e_ms")),
        "commit_ratio": ratio(median(r.first_commit_ms for r in base.values()),
                              median(r.first_commit_ms for r in ok)),
        "commit_ratio_paired_median": paired_ratio_median(_paired(base, ok, "first_commit_ms")),
        "candidate_ready_ms_median": ready,
        "plain_decode_ms_median": base_decode,
        "candidate_ready_vs_plain_decode": ratio(ready, base_decode),
        "paired_cases": len(_paired(base, ok, "e2e_ms")),
    }


def realign_effect(records: Sequence[Record], with_: str = "ooo",
                   without: str = "ooo:no-realign") -> dict[str, Any] | None:
    """Mean accepted tokens per main forward pass on the cases where `with_`'s candidate was
    only partly right (outcome `partial`), with re-alignment and without, same cases."""
    partial = {r.case_id for r in records
               if r.mode == with_ and r.ok and not r.warmup and r.outcome == "partial"}
    if not partial or not any(r.mode == without for r in records):
        return None

    def per_pass(mode: str) -> float | None:
        rates = [(r.accepted_tokens or 0) / r.steps for r in records
                 if r.mode == mode and r.ok and not r.warmup and r.case_id in partial
                 and r.steps]
        return statistics.fmean(rates) if rates else None

    return {"cases": len(partial), "accepted_per_pass_realign": per_pass(with_),
            "accepted_per_pass_no_realign": per_pass(without)}


def summarize(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Per-mode statistics, and every mode's ratios against `baseline` and against vLLM's own
    methods (`vs_plain`, `vs_ngram`, `vs_suffix`) when those modes ran."""
    by_mode = {m: [r for r in records if r.mode == m] for m in modes}
    summary: dict[str, Any] = {"modes": {m: mode_summary(rs) for m, rs in by_mode.items()}}
    summary["realign"] = realign_effect([r for rs in by_mode.values() for r in rs])
    for reference in dict.fromkeys([baseline, *PEERS]):
        if reference in by_mode:
            summary["vs_" + reference] = {
                m: versus_baseline(by_mode[reference], rs)
                for m, rs in by_mode.items()
                if m != reference
            }
    return summary


def summarize_by_source(
    records: Sequence[Record], modes: Sequence[Mode], baseline: str = BASELINE
) -> dict[str, dict[str, Any]]:
    """`summarize` per dataset source (BFCL and the agent set are different workloads), over
    the modes that run on it; multi-turn conversations also by position and per conversation
    (`multi_turn`)."""
    sources = list(dict.fromkeys(r.source for r in records))
    out: dict[str, dict[str, Any]] = {}
    for source in sources:
        mine = [r for r in records if r.source == source]
        names = [m.name for m in modes if m.applies_to(source)]
        out[source] = summarize(mine, names, baseline)
        if source == BFCL_MULTI:
            out[source]["multi_turn"] = multi_turn_summary(mine, names, baseline)
    return out


def multi_turn_summary(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Replayed conversations: `summarize` of the first calls and of the later calls apart (a
    first call meets a fresh schema; later ones repeat tools and copy earlier results), and
    per-conversation totals."""
    return {
        "first_calls": summarize([r for r in records if r.call_index == 0], modes, baseline),
        "later_calls": summarize([r for r in records if (r.call_index or 0) > 0], modes,
                                 baseline),
        "conversations": conversation_totals(records, modes, baseline),
    }


def conversation_totals(
    records: Sequence[Record], modes: Sequence[str], baseline: str = BASELINE
) -> dict[str, Any]:
    """Per mode, over the conversations it answered completely (every measured call ok, the
    same calls as the baseline's): main passes and end-to-end time summed per conversation
    (medians), the per-conversation ratios baseline / mode (median), and the share of
    conversations whose every call was identical to the baseline's."""
    measured = [r for r in records if not r.warmup and r.conversation is not None]

    def complete(mode: str) -> dict[str, list[Record]]:
        by_conv: dict[str, list[Record]] = {}
        for r in measured:
            if r.mode == mode:
                by_conv.setdefault(r.conversation or "", []).append(r)
        return {c: rs for c, rs in by_conv.items() if all(r.ok for r in rs)}

    base = complete(baseline) if baseline in modes else {}
    out: dict[str, Any] = {}
    for mode in modes:
        convs = complete(mode)
        paired = {c: rs for c, rs in convs.items()
                  if c in base and {r.case_id for r in rs} == {r.case_id for r in base[c]}}
        passes = {c: float(sum(r.steps or 0 for r in rs)) for c, rs in convs.items()}
        e2e = {c: sum(r.e2e_ms for r in rs) for c, rs in convs.items()}
        base_passes = {c: float(sum(r.steps or 0 for r in base[c])) for c in paired}
        base_e2e = {c: sum(r.e2e_ms for r in base[c]) for c in paired}
        out[mode] = {
            "conversations": len(convs),
            "calls": sum(len(rs) for rs in convs.values()),
            "passes_median": median(passes.values()),
            "e2e_ms_median": median(e2e.values()),
            "passes_ratio_paired_median": paired_ratio_median(
                [(base_passes[c], passes[c]) for c in paired]),
            "e2e_ratio_paired_median": paired_ratio_median(
                [(base_e2e[c], e2e[c]) for c in paired]),
            "identical_conversations": share(
                all(r.identical_to_plain for r in rs) for rs in paired.values()),
            "paired_conversations": len(paired),
        }
    return out


def records_as_dicts(records: Sequence[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
