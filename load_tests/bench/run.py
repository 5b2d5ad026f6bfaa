"""The run loop: every request of a run in order (warm-ups, then each case in every mode, the
order rotated), sent one at a time within the run's limits."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from load_tests.bench.datasets import Case, case_source
from load_tests.bench.modes import Mode, mode_order
from load_tests.bench.records import (
    Record,
    RequestSettings,
    build_request,
    describe_error,
    mark_agreement,
    mark_identity,
    record_from_response,
)


class BenchAborted(RuntimeError):
    pass


@dataclass
class RunLimits:
    request_timeout_s: float = 120.0
    max_duration_s: float = 3600.0
    max_consecutive_errors: int = 10


PlanItem = tuple[Case, Mode, int, bool]  # case, mode, position in the case's order, warm-up


def build_plan(cases: Sequence[Case], modes: Sequence[Mode], warmup: int) -> list[PlanItem]:
    """Every request of a run, in order: warm-ups first (`warmup` cases of each dataset source,
    so every mode is warmed on the kind of request it will serve), then each case in every mode
    that applies to its source, the order rotated from case to case."""
    plan: list[PlanItem] = []
    by_source: dict[str, list[Case]] = {}
    for case in cases:
        by_source.setdefault(case_source(case), []).append(case)
    for source, group in by_source.items():
        applicable = [m for m in modes if m.applies_to(source)]
        for i in range(warmup):
            case = group[i % len(group)]
            plan += [(case, m, p, True) for p, m in enumerate(mode_order(applicable, i))]
    for i, case in enumerate(cases):
        applicable = [m for m in modes if m.applies_to(case_source(case))]
        plan += [(case, m, p, False) for p, m in enumerate(mode_order(applicable, i))]
    return plan


def run_bench(
    client: Any,
    cases: Sequence[Case],
    modes: Sequence[Mode],
    settings: RequestSettings,
    warmup: int = 2,
    limits: RunLimits | None = None,
    progress: Callable[[Record], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[Record], str | None]:
    """Run every case in every mode, interleaved and rotated; return (records, stop reason).

    `client` is an `openai.OpenAI` (or anything with `.chat.completions.create(**kwargs)`).
    The stop reason is None when every request was sent.
    """
    limits = limits or RunLimits()
    records: list[Record] = []
    started = clock()
    consecutive_errors = 0
    plan = build_plan(cases, modes, warmup)

    stop_reason: str | None = None
    for case, mode, position, is_warmup in plan:
        if clock() - started > limits.max_duration_s:
            stop_reason = f"time budget of {limits.max_duration_s:.0f} s spent"
            break
        kwargs = build_request(case, mode, settings)
        t0 = clock()
        try:
            response = client.chat.completions.create(timeout=limits.request_timeout_s, **kwargs)
            record = record_from_response(
                response, case, mode.name, position, (clock() - t0) * 1000, is_warmup
            )
            consecutive_errors = 0
        except KeyboardInterrupt:
            stop_reason = "interrupted"  # keep (and report) what was measured so far
            break
        except Exception as exc:  # noqa: BLE001 - every failure becomes a record
            record = Record(case.id, case.category, mode.name, position, is_warmup,
                            error=describe_error(exc), e2e_ms=(clock() - t0) * 1000,
                            source=case_source(case),
                            conversation=getattr(case, "conversation", None),
                            call_index=getattr(case, "index", None))
            consecutive_errors += 1
            status = getattr(exc, "status_code", None)
            if is_warmup and isinstance(status, int) and 400 <= status < 500:
                # A mode the server cannot serve (e.g. no n-gram engine deployed) will not
                # start working halfway through: say so now instead of after N failures.
                records.append(record)
                stop_reason = f"the server rejected mode '{mode.name}': {record.error}"
                break
        records.append(record)
        if progress is not None:
            progress(record)
        if consecutive_errors >= limits.max_consecutive_errors:
            stop_reason = (
                f"{consecutive_errors} failed requests in a row; last: {record.error}"
            )
            break
    mark_identity(records)
    mark_agreement(records, cases)
    return records, stop_reason
