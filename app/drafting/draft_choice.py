"""Which source drafts a row this step, and what each source's drafts earned.

Every step each source may propose a continuation for a row (candidates from the sidecar,
history or the schemas, anchored by text alignment; the tenant's suffix index; prompt lookup).
One is drafted: the one with the most tokens the main model is expected to accept, from each
source's evidence in this request (`SourceRates`). A source's per-token acceptance `p` is
unknown; its evidence is a Beta(alpha, beta) belief about it: `PRIOR_WEIGHT` pseudo-tokens at
`PRIOR`, plus the tokens of this request's drafts it got accepted (successes) and rejected
(failures), older steps weighing less (`DECAY`). The chance a draft's first `i` tokens are all
accepted is then the Beta-geometric survival B(alpha + i, beta) / B(alpha, beta): position `i`
is accepted with chance (alpha + i) / (alpha + beta + i) once the `i` before it were. Each
accepted position makes the next likelier: drafts are right for a long stretch or wrong
early, and a constant per-token rate (which the mixture replaces) cut the long right ones short.
Expected accepted tokens are the sum of the survivals. Ties go by the order of `DRAFT_SOURCES`
(a prediction made for this request first).
A request's evidence starts empty (never from other requests: one tenant's traffic must not
change another's drafts) and follows what the engine accepts, so a source that keeps failing on
this output (a schema's placeholder value, an earlier output that went elsewhere) gives way to
one that does not. A step's evidence is read as a geometric trial: `a` of `L` drafted tokens
accepted is `a` successes and, when `a < L`, one failure (the rejected token; those after it
were never tried).

At the next step the committed tokens settle the draft (`settle`): how many it got accepted,
and how many of those the best of the other sources' proposals at that step would not have had
accepted (its `gain` over the others). A token-level source (suffix, lookup) is only asked for
a proposal that could win (`could_win`) or when the sidecar's candidate is in play: the
sidecar's gain is measured against every other source, the others' against the proposals that
could have been chosen instead. Pure functions and small records: the proposer calls
them once per row per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.speculation.draft_sources import DRAFT_SOURCES, DraftSource, SourceTally

# The belief before any evidence: a per-token acceptance of 0.75 worth two tokens. Drafted to
# the budget, the sources' accepted runs on the bench's multi-turn calls gave per-token rates of
# about 0.7 (schema) to 0.8 (suffix) (docs/bench/suffix.md); two tokens let a request's own
# first steps outweigh it.
PRIOR = 0.75
PRIOR_WEIGHT = 2.0
# Each step's older evidence is worth this much of what it was: recent steps decide.
DECAY = 0.8
_RANK = {source: index for index, source in enumerate(DRAFT_SOURCES)}


@dataclass(frozen=True)
class Proposal:
    source: DraftSource
    tokens: list[int]
    # For a token matcher (suffix, lookup): the context it matched, in tokens (0: a candidate).
    match: int = 0
    # Each token's chance given the ones before it by the source's own counts (the suffix
    # trie's shares of a context's continuations); empty: the source counts nothing.
    odds: tuple[float, ...] = ()

    def rates(self, rates: SourceRates) -> list[float]:
        """Each position's chance of acceptance: the source's record in this request, times
        its own odds there (a fork the tenant's outputs took both ways halves a position).

        >>> Proposal("suffix", [1, 2], odds=(0.5, 1.0)).rates(SourceRates())
        [0.375, 0.8333333333333334]
        """
        found = rates.position_rates(self.source, len(self.tokens))
        return [rate * odd for rate, odd in zip(found, self.odds, strict=False)] + found[
            len(self.odds):]


@dataclass(frozen=True)
class Evidence:
    """A source's accepted (successes) and rejected (failures) tokens, decayed."""

    successes: float = 0.0
    failures: float = 0.0

    def position_rates(self, length: int) -> list[float]:
        """Each position's chance of acceptance given every position before it was accepted
        (the Beta-geometric predictive; see the module docstring).

        >>> [round(p, 3) for p in Evidence().position_rates(3)]
        [0.75, 0.833, 0.875]
        >>> [round(p, 3) for p in Evidence(0.0, 4.0).position_rates(2)]
        [0.25, 0.357]
        """
        alpha = self.successes + PRIOR_WEIGHT * PRIOR
        total = self.successes + self.failures + PRIOR_WEIGHT
        return [(alpha + i) / (total + i) for i in range(length)]

    def mean(self) -> float:
        return self.position_rates(1)[0]


def survival(rates: Sequence[float]) -> list[float]:
    """The chance that each position and all before it are accepted.

    >>> survival([0.5, 0.5, 1.0])
    [0.5, 0.25, 0.25]
    """
    out: list[float] = []
    alive = 1.0
    for rate in rates:
        alive *= rate
        out.append(alive)
    return out


def expected_accepted(rates: Sequence[float]) -> float:
    """Accepted tokens expected from a draft with these per-position rates.

    >>> expected_accepted([0.5, 0.5]), expected_accepted([1.0] * 3)
    (0.75, 3.0)
    """
    return sum(survival(rates))


@dataclass
class SourceRates:
    """Each source's evidence in one request (see the module docstring)."""

    evidence: dict[DraftSource, Evidence] = field(default_factory=dict)

    def of(self, source: DraftSource) -> Evidence:
        return self.evidence.get(source, Evidence())

    def rate(self, source: DraftSource) -> float:
        """The source's expected per-token acceptance (its first position's)."""
        return self.of(source).mean()

    def position_rates(self, source: DraftSource, length: int) -> list[float]:
        return self.of(source).position_rates(length)

    def observe(self, source: DraftSource, drafted: int, accepted: int) -> None:
        """One step's evidence: `accepted` of `drafted` tokens (see the module docstring).

        >>> rates = SourceRates()
        >>> rates.observe("suffix", 16, 16); round(rates.rate("suffix"), 3)
        0.972
        >>> rates.observe("suffix", 4, 0); round(rates.rate("suffix"), 3)
        0.905
        """
        if drafted <= 0:
            return
        accepted = min(accepted, drafted)
        old = self.of(source)
        self.evidence[source] = Evidence(
            DECAY * old.successes + accepted,
            DECAY * old.failures + (1 if accepted < drafted else 0))


def _key(proposal: Proposal, rates: SourceRates) -> tuple[float, int]:
    return round(expected_accepted(proposal.rates(rates)), 9), -_RANK[proposal.source]


def choose(proposals: Sequence[Proposal], rates: SourceRates) -> Proposal | None:
    """The proposal with the most expected accepted tokens (see the module docstring).

    >>> rates = SourceRates({"schema": Evidence(0.0, 8.0)})
    >>> choose([Proposal("schema", [1, 2, 3]), Proposal("suffix", [4, 5])], rates).source
    'suffix'
    """
    best: Proposal | None = None
    best_key: tuple[float, int] | None = None
    for proposal in proposals:
        if not proposal.tokens:
            continue
        key = _key(proposal, rates)
        if best_key is None or key > best_key:
            best, best_key = proposal, key
    return best


def could_win(
    source: DraftSource, budget: int, proposals: Sequence[Proposal], rates: SourceRates
) -> bool:
    """Whether a draft of `source` could be chosen over `proposals` (at its longest, `budget`
    tokens): the proposer asks before computing one.

    >>> could_win("lookup", 4, [Proposal("schema", [1, 2, 3, 4])], SourceRates())
    False
    >>> could_win("lookup", 4, [Proposal("schema", [1, 2])], SourceRates())
    True
    """
    best = max((_key(p, rates) for p in proposals if p.tokens), default=None)
    # At its longest and surest (odds of 1 throughout): an upper bound on what it could draft.
    return best is None or _key(Proposal(source, [0] * budget), rates) > best


def agreed(draft: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading tokens of `draft` the committed tokens confirm.

    >>> agreed([1, 2, 3], [1, 2, 9]), agreed([1, 2], [1, 2, 3])
    (2, 2)
    """
    count = 0
    for drafted, done in zip(draft, committed, strict=False):
        if drafted != done:
            break
        count += 1
    return count


@dataclass(frozen=True)
class PendingDraft:
    """A row's draft of the last step, with the proposals it was chosen over."""

    chosen: Proposal
    others: tuple[Proposal, ...] = ()

    def settle(self, committed: Sequence[int]) -> SourceTally:
        """What the draft earned, from the tokens the step committed (accepted drafts plus
        the one the main model sampled after them). Its drafted tokens were counted when it
        was drafted (a request's last draft is never settled)."""
        accepted = max(0, min(len(committed) - 1, len(self.chosen.tokens)))
        # Another source's draft would have been accepted as far as it agrees with what was
        # committed (beyond that the step does not tell).
        best_other = max((agreed(p.tokens, committed) for p in self.others), default=0)
        return SourceTally(accepted_tokens=accepted, gain_tokens=accepted - best_other)
