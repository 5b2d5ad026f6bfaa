"""Which source drafts a row, and what its draft earned (app/drafting/draft_choice.py)."""

from __future__ import annotations

from app.drafting.draft_choice import (
    PRIOR,
    Evidence,
    PendingDraft,
    Proposal,
    SourceRates,
    choose,
    expected_accepted,
    survival,
)


def test_expected_accepted_grows_with_rate_and_length() -> None:
    assert expected_accepted([0.0] * 8) == 0.0
    assert expected_accepted([0.5]) == 0.5
    assert expected_accepted([0.9] * 8) > expected_accepted([0.9] * 4) > \
        expected_accepted([0.5] * 4)


def test_each_accepted_position_makes_the_next_likelier() -> None:
    """The Beta-geometric reading: with no evidence, later positions are likelier (a draft
    that got that far is on track); evidence of rejections lowers every position, of long
    accepted runs raises them."""
    fresh = Evidence().position_rates(8)
    assert fresh[0] == PRIOR and all(a < b for a, b in zip(fresh, fresh[1:], strict=False))
    rates = SourceRates()
    rates.observe("schema", drafted=8, accepted=0)
    rates.observe("schema", drafted=8, accepted=1)
    rates.observe("suffix", drafted=16, accepted=16)
    assert rates.rate("schema") < PRIOR < rates.rate("suffix")
    assert survival(rates.position_rates("suffix", 16))[-1] > 0.7
    assert survival(rates.position_rates("schema", 4))[-1] < 0.2


def test_at_equal_rates_the_longer_draft_then_the_source_order_wins() -> None:
    rates = SourceRates()
    long = Proposal("lookup", [1, 2, 3, 4])
    short = Proposal("sidecar", [1, 2])
    assert choose([short, long], rates) is long
    same = Proposal("schema", [5, 6, 7, 8])
    assert choose([long, same], rates) is same  # schema comes before lookup
    assert choose([], rates) is None
    assert choose([Proposal("suffix", [])], rates) is None


def test_a_source_that_keeps_failing_gives_way() -> None:
    rates = SourceRates()
    schema = Proposal("schema", [1, 2, 3, 4, 5, 6])
    suffix = Proposal("suffix", [7, 8, 9])
    assert choose([schema, suffix], rates) is schema
    for _ in range(3):
        rates.observe("schema", drafted=6, accepted=0)
    assert rates.rate("schema") < PRIOR
    assert choose([schema, suffix], rates) is suffix
    rates.observe("lookup", drafted=0, accepted=0)  # nothing drafted: nothing learnt
    assert rates.rate("lookup") == PRIOR


def test_a_suffix_draft_at_a_fork_weighs_its_odds() -> None:
    """The trie's own odds multiply the source's record: a suffix draft through a fork its
    earlier outputs took two ways loses to a schema draft of the same length, and wins
    where the outputs all went one way."""
    rates = SourceRates()
    schema = Proposal("schema", [1, 2, 3, 4])
    forked = Proposal("suffix", [5, 6, 7, 8], match=3, odds=(0.5, 1.0, 1.0, 1.0))
    sure = Proposal("suffix", [5, 6, 7, 8], match=3, odds=(1.0,) * 4)
    assert choose([forked, schema], rates) is schema
    assert choose([sure, schema], rates) is schema  # a tie at equal odds: the table's order
    rates.observe("schema", drafted=4, accepted=1)
    assert choose([sure, schema], rates) is sure
    assert expected_accepted(forked.rates(rates)) < expected_accepted(sure.rates(rates))


def test_settle_counts_accepted_and_the_gain_over_the_others() -> None:
    chosen = Proposal("sidecar", [1, 2, 3, 4])
    others = (Proposal("schema", [1, 9]), Proposal("suffix", [1, 2, 7]))
    # 1 2 3 accepted, 5 sampled after them; the suffix's draft would have had 1 2 accepted.
    earned = PendingDraft(chosen, others).settle([1, 2, 3, 5])
    assert (earned.drafted_tokens, earned.accepted_tokens, earned.gain_tokens) == (0, 3, 1)
    # Alone, every accepted token is a gain.
    assert PendingDraft(chosen).settle([1, 2, 6]).gain_tokens == 2
    # Another source would have done better: the gain is negative.
    worse = PendingDraft(Proposal("sidecar", [4]), (Proposal("lookup", [1, 2]),))
    assert worse.settle([1]).gain_tokens == -1
