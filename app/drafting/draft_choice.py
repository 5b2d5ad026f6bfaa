"""Which source drafts a row this step, and what each source's drafts earned.

Every step each source may propose a continuation for a row (candidates from the sidecar,
history or the schemas, anchored by text alignment; the tenant's suffix index; prompt lookup).
One is drafted: the one with the most tokens the main model is expected to accept, from each
source's recent per-token acceptance in this request (`SourceRates`): with rate p, a draft of
L tokens is expected to get p + p^2 + ... + p^L accepted (each token only if all before it
were). Ties go by the order of `DRAFT_SOURCES` (a prediction made for this request first).
A request's rates start at `PRIOR` (never from other requests: one tenant's traffic must not
change another's drafts) and follow what the engine accepts, so a source that keeps failing on this
output (a schema's placeholder value, an earlier output that went elsewhere) gives way to one
that does not. A step's evidence is read as a geometric trial: `a` of `L` drafted tokens
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

PRIOR = 0.5
# Weight of the newest step in a source's rate: a few steps decide, one unlucky step does not.
SMOOTHING = 0.3
_RANK = {source: index for index, source in enumerate(DRAFT_SOURCES)}


@dataclass(frozen=True)
class Proposal:
    source: DraftSource
    tokens: list[int]
    # For a token matcher (suffix, lookup): the context it matched, in tokens (0: a candidate).
    match: int = 0


def expected_accepted(rate: float, length: int) -> float:
    """p + p^2 + ... + p^length.

    >>> expected_accepted(0.5, 2), expected_accepted(1.0, 3)
    (0.75, 3.0)
    """
    if rate >= 1.0:
        return float(length)
    return rate * (1 - rate ** length) / (1 - rate)


@dataclass
class SourceRates:
    """Per-token acceptance of each source's drafts in one request, smoothed."""

    rates: dict[DraftSource, float] = field(default_factory=dict)
    smoothing: float = SMOOTHING

    def rate(self, source: DraftSource) -> float:
        return self.rates.get(source, PRIOR)

    def observe(self, source: DraftSource, drafted: int, accepted: int) -> None:
        """One step's evidence: `accepted` of `drafted` tokens (see the module docstring).

        >>> rates = SourceRates(smoothing=1.0)
        >>> rates.observe("suffix", 16, 8); rates.rate("suffix")
        0.8888888888888888
        >>> rates.observe("suffix", 4, 4); rates.rate("suffix")
        1.0
        """
        if drafted <= 0:
            return
        accepted = min(accepted, drafted)
        seen = accepted / (accepted + (1 if accepted < drafted else 0))
        self.rates[source] = (1 - self.smoothing) * self.rate(source) + self.smoothing * seen

    def copy(self) -> SourceRates:
        return SourceRates(dict(self.rates), SMOOTHING)


def _key(source: DraftSource, length: int, rates: SourceRates) -> tuple[float, int]:
    return round(expected_accepted(rates.rate(source), length), 9), -_RANK[source]


def choose(proposals: Sequence[Proposal], rates: SourceRates) -> Proposal | None:
    """The proposal with the most expected accepted tokens (see the module docstring).

    >>> rates = SourceRates({"schema": 0.1})
    >>> choose([Proposal("schema", [1, 2, 3]), Proposal("suffix", [4, 5])], rates).source
    'suffix'
    """
    best: Proposal | None = None
    best_key: tuple[float, int] | None = None
    for proposal in proposals:
        if not proposal.tokens:
            continue
        key = _key(proposal.source, len(proposal.tokens), rates)
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
    best = max((_key(p.source, len(p.tokens), rates) for p in proposals if p.tokens),
               default=None)
    return best is None or _key(source, budget, rates) > best


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
