"""How many draft tokens a row may get this engine step: load-aware speculation.

Drafts are verified in the same forward pass as the row's next token, so each drafted position
costs compute. At small batches that compute is idle anyway (a decode step is memory-bound) and
drafts are nearly free; in a full batch every drafted position competes with other requests'
tokens, and rejected ones are pure loss. Two rules, both pure and per step:

- **Batch**: the step's draft tokens are capped at `step_draft_tokens`, shared evenly among
  the running rows (each at most `k`, at least one); at `no_draft_batch` rows and above nobody
  drafts. Small batches keep the full `k`; a full one spends its compute on its rows' own
  tokens.
- **Row**: a row whose last `reject_streak` drafts were all rejected pauses drafting for
  `pause_steps` steps, then tries again (a model writing a long string value that no candidate
  holds, or one that left every candidate). One accepted token resets the streak.

Any draft budget keeps the output identical: drafts only decide how many tokens a pass may
commit, never which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.config import LoadAwareConfig, Platform, SpeculationConfig
from app.drafting.draft_worth import PLATFORM_VERIFY_RATIO, DraftWorth

# (step_draft_tokens, no_draft_batch) where the config leaves them unset, per platform.
# CPU: compute grows with the tokens of a pass (a drafted token costs about 0.04 of a one-row
# pass, docs/benchmarks.md, "Drafts sized by their worth, side by side"), so a step verifies
# few drafts in all and a full batch none. 64 instead of 16 at 4 agents took 1.26x fewer
# passes and no more requests per second, where prefill decides ("Four agents on a fresh
# server, two step budgets"). GPU: a decode step is memory-bound, drafts ride along nearly
# free until the batch is large.
PLATFORM_BUDGETS: dict[Platform, tuple[int, int]] = {"cpu": (16, 16), "cuda": (256, 128)}


def platform_budgets(load: LoadAwareConfig, platform: Platform) -> tuple[int, int]:
    """(step_draft_tokens, no_draft_batch): the config's where set, else the platform's.

    >>> platform_budgets(LoadAwareConfig(), "cuda")
    (256, 128)
    >>> platform_budgets(LoadAwareConfig(no_draft_batch=8), "cpu")
    (16, 8)
    """
    step, batch = PLATFORM_BUDGETS[platform]
    return (load.step_draft_tokens if load.step_draft_tokens is not None else step,
            load.no_draft_batch if load.no_draft_batch is not None else batch)


@dataclass(frozen=True)
class DraftPolicy:
    k: int
    step_draft_tokens: int = 1 << 30
    no_draft_batch: int = 1 << 30
    reject_streak: int = 0  # 0: rows never pause
    pause_steps: int = 0
    # Off unless configured: a policy built in a test drafts to the budget.
    worth: DraftWorth = field(default_factory=lambda: DraftWorth(enabled=False))

    @classmethod
    def from_config(cls, speculation: SpeculationConfig, platform: Platform) -> DraftPolicy:
        load = speculation.load_aware
        step, batch = platform_budgets(load, platform)
        worth = speculation.draft_worth
        return cls(k=speculation.num_speculative_tokens, step_draft_tokens=step,
                   no_draft_batch=batch, reject_streak=load.reject_streak,
                   pause_steps=load.pause_steps,
                   worth=DraftWorth(
                       enabled=worth.enabled,
                       ratio=worth.verify_cost_ratio or PLATFORM_VERIFY_RATIO[platform],
                       measured=worth.measure_steps and worth.verify_cost_ratio is None,
                       max_spec_factor=worth.max_spec_factor))

    def batch_budget(self, active_rows: int) -> int:
        """Draft tokens each row may get when `active_rows` rows decode this step.

        >>> DraftPolicy(k=16, step_draft_tokens=128, no_draft_batch=64).batch_budget(32)
        4
        """
        if active_rows >= self.no_draft_batch:
            return 0
        return min(self.k, max(1, self.step_draft_tokens // max(active_rows, 1)))


@dataclass
class RowAcceptance:
    """A row's recent drafting record, updated once per step from what the engine accepted."""

    streak: int = 0  # consecutive steps whose drafts were all rejected
    paused_for: int = 0  # steps left without drafting
    drafted: int = 0  # tokens drafted at the previous step

    def observe(self, sampled: int, policy: DraftPolicy) -> None:
        """`sampled`: tokens the engine committed for the row this step (accepted drafts + 1)."""
        if self.paused_for > 0:
            self.paused_for -= 1
        elif self.drafted > 0:
            if sampled > 1:
                self.streak = 0
            else:
                self.streak += 1
                if policy.reject_streak and self.streak >= policy.reject_streak:
                    self.paused_for = policy.pause_steps
                    self.streak = 0
        self.drafted = 0

    @property
    def paused(self) -> bool:
        return self.paused_for > 0
