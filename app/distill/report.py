"""Agreement of the sidecar with the main model on pairs, and the training report.

A pair agrees when the sidecar model's greedy choice at every target position (teacher
forced: each after the main model's own tokens before it) is the main model's token, which is
what its greedy slot generation writes whenever the slot's grammar allows that token (the
grammar only removes other choices). A case agrees when all its pairs do: its tool name and
every argument it wrote, the whole call as slots mode predicts it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel

from app.distill.pairs import Pair


class Agreement(BaseModel):
    pairs: int
    pairs_agree: float | None
    names_agree: float | None  # `name` pairs only
    slots_agree: float | None  # `slot` pairs only
    more_agree: float | None = None  # `more` pairs only (optional keys or not)
    refills_agree: float | None = None  # `refill` pairs only (after the values before)
    cases: int
    cases_agree: float | None  # every pair of the case


def _share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def agreement(pairs: Sequence[Pair], agrees: Sequence[bool]) -> Agreement:
    """Shares of agreeing pairs (overall, per kind) and cases, from one flag per pair."""
    by_case: dict[str, bool] = {}
    for pair, ok in zip(pairs, agrees, strict=True):
        by_case[pair.case_id] = by_case.get(pair.case_id, True) and ok
    return Agreement(
        pairs=len(pairs),
        pairs_agree=_share(list(agrees)),
        names_agree=_share([a for p, a in zip(pairs, agrees, strict=True) if p.kind == "name"]),
        slots_agree=_share([a for p, a in zip(pairs, agrees, strict=True) if p.kind == "slot"]),
        more_agree=_share([a for p, a in zip(pairs, agrees, strict=True) if p.kind == "more"]),
        refills_agree=_share(
            [a for p, a in zip(pairs, agrees, strict=True) if p.kind == "refill"]
        ),
        cases=len(by_case),
        cases_agree=_share(list(by_case.values())),
    )


class TrainingReport(BaseModel):
    """What `ooo-spec sidecar distill` writes beside the adapter (report.json)."""

    seed: int
    steps: int
    train_pairs: int
    held_out_pairs: int
    final_loss: float | None
    train_seconds: float
    before: Agreement  # the base sidecar model, on the held-out pairs
    after: Agreement  # with the adapter


def format_report(report: TrainingReport) -> str:
    def line(label: str, a: Agreement) -> str:
        return (f"{label}: cases {a.cases_agree} of {a.cases}, pairs {a.pairs_agree} of "
                f"{a.pairs} (names {a.names_agree}, slots {a.slots_agree}, "
                f"refilled slots {a.refills_agree}, optional keys {a.more_agree})")

    return "\n".join([
        f"trained {report.steps} steps on {report.train_pairs} pairs in "
        f"{report.train_seconds:.0f} s (seed {report.seed}, last loss {report.final_loss})",
        "held-out agreement with the main model (teacher-forced greedy):",
        line("  before", report.before),
        line("  after ", report.after),
    ])


def report_json(report: TrainingReport) -> str:
    return json.dumps(report.model_dump(), indent=2)
