"""GPU smoke test behind scripts/gpu_smoke.sh: a few BFCL cases with speculation off and on.

What an operator runs once on one GPU host with the image, before trusting a cluster with it:
the app starts from `configs/gpu-smoke-1gpu.yaml` (both engines on one GPU), every case is sent
with `plain` (speculation off) and `ooo` (on) through `load_tests/bench/`'s machinery, and one
line per case says the main model's forward passes per call, tokens per pass and whether the
speculative output is identical to the plain one.

Modes: `plain`, `ngram` and `suffix` (vLLM's own speculation, where the config deploys those
baselines), `drafts` (our drafts without the sidecar) and `ooo`; `--json` writes one file with
the node's facts, every case in every mode, and per mode the passes, tokens per pass, times,
identity to plain and acceptance per draft source (what each number means: docs/benchmarks.md,
"The GPU smoke run"). `--dry-run` builds every request of every mode and writes that file
without a server or a GPU: CI runs it (scripts/gpu_smoke.sh --dry-run) so the script cannot rot.

It passes when every request is answered and speculation drafts at all (some call with more
than one token per pass). Identical-to-plain is printed, not required: in bfloat16 a GPU's
kernels may round differently for a verifying pass than for a single-token one, so a rare
difference there is numerics, not speculation (the float32 check is
tests/integration/test_lossless.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from load_tests.bench import (
    BASELINE,
    Case,
    RequestSettings,
    RunLimits,
    build_request,
    load_cases,
    parse_dataset_spec,
    parse_modes,
    run_bench,
    served_model,
)
from load_tests.bench import Record as BenchRecord

SMOKE_CONFIG = "configs/gpu-smoke-1gpu.yaml"
SMOKE_DATASET = "bfcl:simple_python,multiple"
SMOKE_MODES = "plain,ooo"
# What the smoke run sends when the config deploys the baselines (`baselines.ngram`,
# `baselines.suffix`); a mode whose engine is not deployed is skipped and said so.
ALL_MODES = ("plain", "ngram", "suffix", "drafts", "ooo")
SPECULATIVE = "ooo"


@dataclass(frozen=True)
class SmokeRow:
    """One case: the main model's passes and tokens with speculation off and on."""

    case_id: str
    plain_passes: int | None
    plain_tokens: int | None
    ooo_passes: int | None
    ooo_tokens: int | None
    outcome: str | None
    identical: bool | None
    error: str | None = None

    @property
    def ooo_tokens_per_pass(self) -> float | None:
        if not self.ooo_passes or self.ooo_tokens is None:
            return None
        return self.ooo_tokens / self.ooo_passes


def smoke_cases(limit: int) -> list[Case]:
    """The request set: the first `limit` cases of each smoke category."""
    return load_cases(parse_dataset_spec(SMOKE_DATASET), limit)


def smoke_rows(records: Sequence[BenchRecord]) -> list[SmokeRow]:
    """One row per case from the bench records (warm-ups left out), in the order sent."""
    by_case: dict[str, dict[str, BenchRecord]] = {}
    for record in records:
        if not record.warmup:
            by_case.setdefault(record.case_id, {})[record.mode] = record
    rows = []
    for case_id, modes in by_case.items():
        plain, ooo = modes.get(BASELINE), modes.get(SPECULATIVE)
        errors = [f"{r.mode}: {r.error}" for r in (plain, ooo) if r is not None and r.error]
        if plain is None or ooo is None:
            errors.append("not sent in both modes")
        rows.append(SmokeRow(
            case_id=case_id,
            plain_passes=plain.steps if plain else None,
            plain_tokens=plain.completion_tokens if plain else None,
            ooo_passes=ooo.steps if ooo else None,
            ooo_tokens=ooo.completion_tokens if ooo else None,
            outcome=ooo.outcome if ooo else None,
            identical=ooo.identical_to_plain if ooo else None,
            error="; ".join(errors) or None,
        ))
    return rows


def smoke_problems(rows: Sequence[SmokeRow], stop_reason: str | None = None) -> list[str]:
    """Why the smoke test fails; empty when it passes."""
    problems = [f"{r.case_id}: {r.error}" for r in rows if r.error]
    if stop_reason:
        problems.append(f"stopped early: {stop_reason}")
    if not rows:
        problems.append("no case was sent")
    elif not any((r.ooo_tokens_per_pass or 0) > 1 for r in rows if not r.error):
        problems.append("speculation never drafted: no call had more than 1 token per pass")
    return problems


def _cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_smoke(rows: Sequence[SmokeRow], problems: Sequence[str]) -> str:
    header = ("case", "plain passes", "ooo passes", "ooo tokens", "tokens/pass", "outcome",
              "identical to plain")
    table = [header] + [
        (r.case_id, _cell(r.plain_passes), _cell(r.ooo_passes), _cell(r.ooo_tokens),
         _cell(r.ooo_tokens_per_pass, 2), _cell(r.outcome), _cell(r.identical))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    done = [r for r in rows if not r.error and r.plain_passes and r.ooo_passes]
    if done:
        plain = sum(r.plain_passes or 0 for r in done)
        ooo = sum(r.ooo_passes or 0 for r in done)
        same = sum(1 for r in done if r.identical)
        lines.append(
            f"total: {plain} passes plain, {ooo} with speculation ({plain / max(ooo, 1):.2f}x "
            f"fewer); identical to plain {same}/{len(done)}"
        )
    lines += [f"FAIL {p}" for p in problems] or ["PASS"]
    return "\n".join(lines)


def run_records(
    client: Any, cases: Sequence[Case], model: str, timeout_s: float, modes: str = SMOKE_MODES
) -> tuple[list[BenchRecord], str | None]:
    """Send every case in every mode (one warm-up each) through `client` (an `openai.OpenAI`)."""
    return run_bench(
        client, cases, parse_modes(modes), RequestSettings(model=model), warmup=1,
        limits=RunLimits(request_timeout_s=timeout_s, max_consecutive_errors=4),
    )


def run_cases(
    client: Any, cases: Sequence[Case], model: str, timeout_s: float, modes: str = SMOKE_MODES
) -> tuple[list[SmokeRow], str | None]:
    records, stop_reason = run_records(client, cases, model, timeout_s, modes)
    return smoke_rows(records), stop_reason


def run(
    base_url: str, cases: Sequence[Case], timeout_s: float, modes: str = SMOKE_MODES
) -> tuple[list[BenchRecord], str | None]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="ooo-spec-smoke", max_retries=0,
                    timeout=timeout_s)
    try:
        return run_records(client, cases, served_model(base_url), timeout_s, modes)
    finally:
        client.close()


def deployed_modes(serve_config: dict[str, Any], wanted: Sequence[str]
                   ) -> tuple[list[str], dict[str, str]]:
    """The modes of `wanted` the config can serve, and why each other one is skipped."""
    (application,) = serve_config["applications"]
    baselines = (application.get("args") or {}).get("baselines") or {}
    run_now: list[str] = []
    skipped: dict[str, str] = {}
    for mode in wanted:
        if mode in ("ngram", "suffix") and not (baselines.get(mode) or {}).get("enabled"):
            skipped[mode] = f"`baselines.{mode}` is not deployed by this config"
        else:
            run_now.append(mode)
    return run_now, skipped


def mode_summary(records: Sequence[BenchRecord]) -> dict[str, dict[str, Any]]:
    """Per mode (warm-ups left out): requests, errors, the main model's passes and tokens,
    tokens per pass, end-to-end times, answers identical to plain, and per draft source the
    tokens drafted and accepted (acceptance = accepted / drafted)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r.mode for r in records):
        done = [r for r in records if r.mode == mode and not r.warmup]
        ok = [r for r in done if r.ok]
        passes = sum(r.steps or 0 for r in ok)
        tokens = sum(r.completion_tokens or 0 for r in ok)
        compared = [r for r in ok if r.identical_to_plain is not None]
        sources: dict[str, dict[str, Any]] = {}
        for record in ok:
            for source, tally in record.sources.items():
                into = sources.setdefault(source, {"drafted_tokens": 0, "accepted_tokens": 0})
                into["drafted_tokens"] += tally.get("drafted_tokens", 0)
                into["accepted_tokens"] += tally.get("accepted_tokens", 0)
        for tally in sources.values():
            tally["acceptance"] = (round(tally["accepted_tokens"] / tally["drafted_tokens"], 4)
                                   if tally["drafted_tokens"] else None)
        times = [r.e2e_ms for r in ok]
        out[mode] = {
            "requests": len(done), "errors": len(done) - len(ok), "passes": passes,
            "completion_tokens": tokens,
            "tokens_per_pass": round(tokens / passes, 3) if passes else None,
            "e2e_ms_median": round(statistics.median(times), 1) if times else None,
            "e2e_ms_total": round(sum(times), 1),
            "identical_to_plain": (f"{sum(1 for r in compared if r.identical_to_plain)}"
                                   f"/{len(compared)}" if compared else None),
            "drafted_tokens": sum(r.drafted_tokens or 0 for r in ok),
            "accepted_tokens": sum(r.accepted_tokens or 0 for r in ok),
            "sources": sources,
        }
    return out


def smoke_report(
    records: Sequence[BenchRecord], stop_reason: str | None, facts: dict[str, Any],
    config: str, modes: Sequence[str], skipped: dict[str, str], timings: dict[str, float],
    dry_run: bool = False,
) -> dict[str, Any]:
    """The one JSON file of a smoke run (docs/benchmarks.md says what each field means)."""
    rows = smoke_rows(records)
    problems = [] if dry_run else smoke_problems(rows, stop_reason)
    return {
        "dry_run": dry_run, "config": config, "facts": facts, "modes": list(modes),
        "skipped_modes": skipped, "timings_s": timings, "per_mode": mode_summary(records),
        "cases": [{**asdict(r), "ooo_tokens_per_pass": r.ooo_tokens_per_pass} for r in rows],
        "problems": problems, "passed": not problems,
    }


def rehearse(config: str, cases: Sequence[Case], modes: Sequence[str]) -> dict[str, int]:
    """The dry run's checks: the config is a Serve config the app accepts, and every case has
    a request in every mode (what the real run sends). Requests built per mode."""
    from app.config import AppConfig
    from deployments import local

    serve_config = local.load_serve_config(config)
    (application,) = serve_config["applications"]
    app_config = AppConfig.model_validate(application.get("args") or {})
    model = app_config.main.engine.served_model_name or app_config.main.engine.model
    settings = RequestSettings(model=model)
    built: dict[str, int] = {}
    for mode in parse_modes(",".join(modes)):
        built[mode.name] = sum(1 for case in cases if build_request(case, mode, settings))
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=SMOKE_CONFIG, help="Serve config to start")
    parser.add_argument("--base-url", default=None,
                        help="test a server that is already running instead of starting one")
    parser.add_argument("--limit", type=int, default=3, help="cases per BFCL category")
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    parser.add_argument("--modes", default=",".join(ALL_MODES),
                        help="modes to send (ngram, suffix: where the config deploys them)")
    parser.add_argument("--json", default=None, help="write the run's report here")
    parser.add_argument("--facts", default=None,
                        help="JSON file of the node's facts (GPU, driver, versions) to include")
    parser.add_argument("--dry-run", action="store_true",
                        help="no server, no GPU: check the config and build every request")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    cases = smoke_cases(args.limit)
    from deployments import local

    modes, skipped = deployed_modes(local.load_serve_config(args.config),
                                    [m for m in args.modes.split(",") if m])
    if "plain" not in modes:
        parser.error("the modes must include plain (identity is measured against it)")
    facts = json.loads(Path(args.facts).read_text()) if args.facts else {}
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    timings: dict[str, float] = {"cases_s": round(time.monotonic() - t0, 1)}
    records: list[BenchRecord] = []
    stop_reason: str | None = None
    if args.dry_run:
        built = rehearse(args.config, cases, modes)
        say(f"gpu smoke (dry run): {len(cases)} cases; requests built per mode: {built}; "
            f"skipped: {skipped or 'none'}")
    else:
        started = False
        try:
            if args.base_url is None:
                say(f"gpu smoke: starting the app from {args.config} (minutes: loads the models)")
                t_start = time.monotonic()
                started = True
                base_url = local.start(local.load_serve_config(args.config))
                timings["start_s"] = round(time.monotonic() - t_start, 1)
                say(f"gpu smoke: ready in {timings['start_s']:.0f} s")
            else:
                base_url = args.base_url.rstrip("/")
            say(f"gpu smoke: {len(cases)} cases x {','.join(modes)}"
                + (f" (skipped: {', '.join(skipped)})" if skipped else ""))
            t_bench = time.monotonic()
            records, stop_reason = run(base_url, cases, args.timeout, ",".join(modes))
            timings["bench_s"] = round(time.monotonic() - t_bench, 1)
        finally:
            if started:
                local.stop()
    timings["total_s"] = round(time.monotonic() - t0, 1)
    report = smoke_report(records, stop_reason, facts, args.config, modes, skipped, timings,
                          dry_run=args.dry_run)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        say(f"gpu smoke: report written to {args.json}")
    if not args.dry_run:
        rows = smoke_rows(records)
        print(format_smoke(rows, report["problems"]))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
