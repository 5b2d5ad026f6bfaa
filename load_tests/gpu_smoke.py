"""GPU smoke test behind scripts/gpu_smoke.sh: a few BFCL cases with speculation off and on.

What an operator runs once on one GPU host with the image, before trusting a cluster with it:
the app starts from `configs/gpu-smoke-1gpu.yaml` (both engines on one GPU), every case is sent
with `plain` (speculation off) and `ooo` (on) through `load_tests/bench.py`'s machinery, and one
line per case says the main model's forward passes per call, tokens per pass and whether the
speculative output is identical to the plain one.

It passes when every request is answered and speculation drafts at all (some call with more
than one token per pass). Identical-to-plain is printed, not required: in bfloat16 a GPU's
kernels may round differently for a verifying pass than for a single-token one, so a rare
difference there is numerics, not speculation (the float32 check is
tests/integration/test_lossless.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from load_tests.bench import (
    BASELINE,
    Case,
    RequestSettings,
    RunLimits,
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


def run_cases(
    client: Any, cases: Sequence[Case], model: str, timeout_s: float
) -> tuple[list[SmokeRow], str | None]:
    """Send every case in both modes (one warm-up each) through `client` (an `openai.OpenAI`)."""
    records, stop_reason = run_bench(
        client, cases, parse_modes(SMOKE_MODES), RequestSettings(model=model), warmup=1,
        limits=RunLimits(request_timeout_s=timeout_s, max_consecutive_errors=4),
    )
    return smoke_rows(records), stop_reason


def run(
    base_url: str, cases: Sequence[Case], timeout_s: float
) -> tuple[list[SmokeRow], str | None]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="ooo-spec-smoke", max_retries=0,
                    timeout=timeout_s)
    try:
        return run_cases(client, cases, served_model(base_url), timeout_s)
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=SMOKE_CONFIG, help="Serve config to start")
    parser.add_argument("--base-url", default=None,
                        help="test a server that is already running instead of starting one")
    parser.add_argument("--limit", type=int, default=3, help="cases per BFCL category")
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    args = parser.parse_args(argv)
    cases = smoke_cases(args.limit)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started = False
    try:
        if args.base_url is None:
            from deployments import local

            say(f"gpu smoke: starting the app from {args.config} (minutes: loads both models)")
            t0 = time.monotonic()
            started = True
            base_url = local.start(local.load_serve_config(args.config))
            say(f"gpu smoke: ready in {time.monotonic() - t0:.0f} s")
        else:
            base_url = args.base_url.rstrip("/")
        say(f"gpu smoke: {len(cases)} cases x {SMOKE_MODES}")
        rows, stop_reason = run(base_url, cases, args.timeout)
    finally:
        if started:
            from deployments import local

            local.stop()
    problems = smoke_problems(rows, stop_reason)
    print(format_smoke(rows, problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
