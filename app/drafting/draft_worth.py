"""How long a draft is worth: each drafted position's chance of acceptance against what
verifying it costs.

A forward pass that verifies `N` tokens in all costs about `a + b * N` (a fixed part: weights
read, scheduling, Python; and a part per token: compute). A row's draft token at position `i`
is committed only if it and every token before it are accepted, with probability
`q_i = p_1 * ... * p_i`. An output of `T` tokens takes `T - accepted` passes of its row, so
each accepted token saves the row exactly one pass; with `B` rows sharing a step, a row's pass
is `1/B` of a step, `(a + b * N) / B` of time. Adding the token costs `b`. So it pays when
`q_i` exceeds the verify cost

    c = b * B / (a + b * N) = r * B / (1 + r * N),    r = b / a

with `N` the tokens the step verifies (its rows' own and their drafts: the last step's count
stands in for this one's). A draft stops at the first position whose `q_i` falls below `c`:
long where drafts ride nearly free (a memory-bound GPU decode step at small batch: `r` about
0.002, `c` 0.002 at one row), shorter where each verified token costs real compute (this
project's CPU engine: `r` about 0.04, `c` 0.03 at one row drafting 12 tokens, 0.39 at 16 rows
drafting none). `r` per platform is `PLATFORM_VERIFY_RATIO` unless the config sets it;
`PassClock` refines it from the engine's own step times when they vary enough to tell `a` from
`b`.

Per position probabilities come from each source's evidence in the request
(`draft_choice.SourceRates`: a Beta belief about its per-token acceptance, so each accepted
position makes the next likelier). The suffix source drafts no further than `max_spec_factor`
times the context it matched (vLLM's suffix decoding bounds its drafts the same way: a
two-token match of one earlier output rarely predicts sixteen). Prompt lookup is not bounded
so: its match is at most `prompt_lookup_max` tokens (4) by construction, and vLLM's n-gram
drafts its full `k` after it; a cap there held every lookup draft to 4 tokens.
Pure functions and one small estimator: the proposer calls them per row per step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.config import Platform
from app.drafting.draft_choice import survival

# b / a per platform (verify cost of one token over a pass's fixed cost) where the config
# leaves it unset. CPU: a 135M-parameter model on two cores; the bench's 176 speculative
# multi-turn requests (2026-12-04, docs/benchmarks.md, "side by side") fit decode time =
# 71-85 ms a pass plus 2.7-3.3 ms a drafted token. GPU: a decode step reads every weight once
# whatever the tokens; a token's compute is a rounding error at small batch.
PLATFORM_VERIFY_RATIO: dict[Platform, float] = {"cpu": 0.04, "cuda": 0.002}
# The estimate from step times is used only within these bounds (a wrong clock must not turn
# drafting off or make every draft run to the budget).
RATIO_BOUNDS = (0.0005, 1.0)


def verify_cost(ratio: float, rows: int, verified: int | None = None) -> float:
    """The acceptance chance a drafted position needs to pay for its verification, with
    `rows` rows decoding this step and `verified` tokens verified in all (default: the rows'
    own, no drafts).

    >>> round(verify_cost(0.04, 1), 3), round(verify_cost(0.04, 1, 13), 3)
    (0.038, 0.026)
    >>> round(verify_cost(0.04, 16), 3), round(verify_cost(0.002, 1), 4)
    (0.39, 0.002)
    """
    rows = max(rows, 1)
    verified = max(verified or rows, rows)
    return ratio * rows / (1 + ratio * verified)


def worth_length(rates: Sequence[float], cost: float) -> int:
    """How many leading positions to draft: up to the last one whose chance of being committed
    (the product of the rates so far) is at least `cost`.

    >>> worth_length([0.9] * 16, 0.13)   # a sure source drafts long
    16
    >>> worth_length([0.5] * 16, 0.13)   # a coin flip, two
    2
    >>> worth_length([0.5] * 16, 0.002)  # ... unless verifying is nearly free
    8
    """
    for position, alive in enumerate(survival(rates)):
        if alive < cost:
            return position
    return len(rates)


def matcher_cap(match_length: int, max_spec_factor: float) -> int:
    """The longest draft a token matcher may give after matching `match_length` tokens.

    >>> matcher_cap(2, 1.0), matcher_cap(12, 1.0), matcher_cap(3, 2.0)
    (2, 12, 6)
    """
    return max(1, math.floor(match_length * max_spec_factor))


def sized(tokens: list[int], rates: Sequence[float], cost: float,
          cap: int | None = None) -> list[int]:
    """`tokens` cut to what they are worth at their per-position `rates` (and at most `cap`).

    >>> sized(list(range(10)), [0.9] * 10, 0.13), sized(list(range(10)), [0.9] * 10, 0.13, 3)
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2])
    """
    limit = len(tokens) if cap is None else min(len(tokens), cap)
    return tokens[:worth_length(rates[:limit], cost)]


@dataclass
class PassClock:
    """The engine's own step times against the tokens each step verified, fitted to
    `a + b * N` by least squares over the last `window` steps; `ratio` is `b / a` when the
    steps varied enough in `N` to tell (else None: use the platform's)."""

    window: int = 256
    min_spread: float = 4.0  # variance of N (tokens^2) below which a and b cannot be told
    samples: deque[tuple[int, float]] = field(default_factory=deque)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.samples.append((tokens, seconds))
        while len(self.samples) > self.window:
            self.samples.popleft()

    def ratio(self) -> float | None:
        """b / a from the samples, within `RATIO_BOUNDS`; None when they cannot tell.

        >>> clock = PassClock()
        >>> for n in (1, 5, 9, 17) * 8:
        ...     clock.observe(n, 0.020 + 0.003 * n)
        >>> round(clock.ratio(), 3)
        0.15
        """
        n = len(self.samples)
        if n < 16:
            return None
        mean_x = sum(x for x, _ in self.samples) / n
        mean_y = sum(y for _, y in self.samples) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in self.samples) / n
        if var_x < self.min_spread:
            return None
        slope = sum((x - mean_x) * (y - mean_y) for x, y in self.samples) / n / var_x
        intercept = mean_y - slope * mean_x
        if intercept <= 0:
            return RATIO_BOUNDS[1]
        low, high = RATIO_BOUNDS
        return min(high, max(low, slope / intercept))


@dataclass(frozen=True)
class DraftWorth:
    """The proposer's sizing rule: on/off, the platform's ratio (or the config's), the
    suffix source's cap per matched token."""

    enabled: bool = True
    ratio: float = PLATFORM_VERIFY_RATIO["cpu"]
    measured: bool = True  # refine `ratio` from the engine's step times (PassClock)
    max_spec_factor: float = 1.0

    def cost(self, rows: int, clock: PassClock | None = None,
             verified: int | None = None) -> float:
        """The verify cost this step (0 when sizing is off: every draft runs to its budget);
        `verified`: the tokens a step of these rows verifies (see `verify_cost`)."""
        if not self.enabled:
            return 0.0
        ratio = self.ratio
        if self.measured and clock is not None:
            ratio = clock.ratio() or ratio
        return verify_cost(ratio, rows, verified)
