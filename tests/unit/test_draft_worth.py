"""Drafts sized by their worth (app/drafting/draft_worth.py): worked examples of the length
rule, the platform switch, the step clock, and the proposer cutting a weak source's drafts
while a sure one keeps its length."""

from __future__ import annotations

from app.config import SpeculationConfig
from app.drafting.draft_choice import DECAY, Evidence, SourceRates
from app.drafting.draft_policy import DraftPolicy
from app.drafting.draft_worth import (
    PLATFORM_VERIFY_RATIO,
    DraftWorth,
    PassClock,
    matcher_cap,
    sized,
    verify_cost,
    worth_length,
)
from app.speculation.draft_sources import DraftSource
from tests.unit.test_candidate_proposer import CALL, Batch, encode


def test_a_sure_source_drafts_long_and_a_weak_one_short() -> None:
    cpu_one_row = verify_cost(PLATFORM_VERIFY_RATIO["cpu"], 1)
    assert worth_length([0.95] * 16, cpu_one_row) == 16
    assert worth_length([0.6] * 16, cpu_one_row) == 6  # 0.6^6 = 0.047, 0.6^7 = 0.028 < 0.038
    assert worth_length([0.2] * 16, cpu_one_row) == 2
    assert worth_length([0.03] * 16, cpu_one_row) == 0  # not worth one verified token
    # Position by position: a sure stretch then a guess (a schema's keys, then its value).
    assert worth_length([0.99, 0.99, 0.99, 0.01, 0.99], cpu_one_row) == 3


def test_the_cost_follows_the_platform_and_the_batch() -> None:
    """The same evidence drafts long on a GPU and short on a loaded CPU."""
    rates = [0.7] * 16
    gpu = [worth_length(rates, verify_cost(PLATFORM_VERIFY_RATIO["cuda"], rows))
           for rows in (1, 16, 64)]
    cpu = [worth_length(rates, verify_cost(PLATFORM_VERIFY_RATIO["cpu"], rows))
           for rows in (1, 4, 16)]
    assert gpu == [16, 9, 6]
    assert cpu == [9, 5, 2]
    assert verify_cost(0.04, 16) > verify_cost(0.04, 4) > verify_cost(0.04, 1)
    # Drafts in the step make each pass dearer, so a saved pass is worth more: the bar drops.
    assert verify_cost(0.04, 1, 17) < verify_cost(0.04, 1)
    assert verify_cost(0.04, 16, 64) < verify_cost(0.04, 16)


def test_matchers_draft_no_further_than_their_match_allows() -> None:
    assert matcher_cap(2, 1.0) == 2 and matcher_cap(16, 1.0) == 16
    tokens = list(range(16))
    assert sized(tokens, [0.99] * 16, 0.13, cap=matcher_cap(2, 1.0)) == [0, 1]
    assert sized(tokens, [0.99] * 16, 0.13, cap=matcher_cap(12, 1.0)) == tokens[:12]


def test_worked_examples_of_the_length_rule_from_a_sources_evidence() -> None:
    """A source whose drafts were accepted whole drafts long, one that keeps being rejected
    short, a fresh one in between; the same evidence drafts long on a GPU at 16 rows and
    short on the CPU at 16 rows."""
    sure, weak = SourceRates(), SourceRates()
    for _ in range(3):
        sure.observe("suffix", drafted=16, accepted=16)
        weak.observe("lookup", drafted=8, accepted=0)
    cpu = {rows: verify_cost(PLATFORM_VERIFY_RATIO["cpu"], rows) for rows in (1, 4, 16)}
    gpu16 = verify_cost(PLATFORM_VERIFY_RATIO["cuda"], 16)

    def length(rates: SourceRates, source: DraftSource, cost: float) -> int:
        return worth_length(rates.position_rates(source, 16), cost)

    assert length(sure, "suffix", cpu[1]) == 16
    assert length(weak, "lookup", cpu[1]) <= 4
    assert [length(SourceRates(), "schema", cpu[rows]) for rows in (1, 4, 16)] == [16, 16, 7]
    assert length(sure, "suffix", cpu[16]) == 16 and length(weak, "lookup", cpu[16]) == 0
    assert length(sure, "suffix", cpu[16]) > length(SourceRates(), "schema", cpu[16])
    assert length(weak, "lookup", gpu16) > length(weak, "lookup", cpu[1]) > \
        length(weak, "lookup", cpu[16])
    assert length(SourceRates(), "schema", gpu16) == 16


def test_the_clock_reads_the_ratio_from_step_times_and_refuses_to_guess() -> None:
    clock = PassClock()
    for _ in range(20):
        clock.observe(1, 0.02)  # always one token: a and b cannot be told apart
    assert clock.ratio() is None
    clock = PassClock()
    for n in (1, 3, 9, 17) * 10:
        clock.observe(n, 0.01 + 0.002 * n)
    assert abs((clock.ratio() or 0) - 0.2) < 0.02
    worth = DraftWorth(ratio=0.002)
    assert worth.cost(1, clock) == verify_cost(clock.ratio() or 0, 1)
    assert DraftWorth(ratio=0.002, measured=False).cost(1, clock) == verify_cost(0.002, 1)
    assert DraftWorth(enabled=False).cost(16, clock) == 0.0


def test_the_config_picks_the_platform_ratio_unless_set() -> None:
    spec = SpeculationConfig()
    assert DraftPolicy.from_config(spec, "cpu").worth.ratio == PLATFORM_VERIFY_RATIO["cpu"]
    assert DraftPolicy.from_config(spec, "cuda").worth.ratio == PLATFORM_VERIFY_RATIO["cuda"]
    fixed = SpeculationConfig.model_validate({"draft_worth": {"verify_cost_ratio": 0.5}})
    policy = DraftPolicy.from_config(fixed, "cuda")
    assert (policy.worth.ratio, policy.worth.measured) == (0.5, False)
    off = SpeculationConfig.model_validate({"draft_worth": {"enabled": False}})
    assert DraftPolicy.from_config(off, "cpu").worth.cost(1) == 0.0


def test_rates_read_a_step_as_a_geometric_trial() -> None:
    rates = SourceRates()
    rates.observe("schema", drafted=16, accepted=15)  # 15 successes, one failure
    assert rates.of("schema") == Evidence(15.0, 1.0)
    rates.observe("schema", drafted=2, accepted=2)  # nothing rejected
    assert rates.of("schema") == Evidence(DECAY * 15 + 2, DECAY * 1)
    rates.observe("lookup", drafted=8, accepted=0)
    assert rates.of("lookup") == Evidence(0.0, 1.0)


def test_the_proposer_cuts_a_weak_candidate_and_keeps_a_sure_one_long() -> None:
    """One row follows its candidate to the end (its drafts stay long); the other
    writes something else, so its candidate's drafts are rejected and shrink to nothing."""
    policy = DraftPolicy(k=8, worth=DraftWorth(ratio=0.15, measured=False))
    right = encode(CALL)
    wrong = encode(CALL.replace("Paris", "Tokyo, Japan, the capital").replace("celsius", "kelvin"))
    batch = Batch([right, wrong], policy=policy, k=8)
    batch.store.add_candidates("r0", [CALL])
    batch.store.add_candidates("r1", [CALL])
    lengths: list[list[int]] = [[], []]
    drafts = batch.step([1, 1])
    while batch.done[0] < len(right) - 1 and batch.done[1] < len(wrong) - 1:
        for row in (0, 1):
            lengths[row].append(len(drafts[row]))
        advance = []
        for row, output in enumerate((right, wrong)):
            accepted = 0
            for token in drafts[row]:
                if batch.done[row] + accepted < len(output) and \
                        output[batch.done[row] + accepted] == token:
                    accepted += 1
                else:
                    break
            advance.append(min(accepted + 1, len(output) - batch.done[row]))
        drafts = batch.step(advance)
    assert min(lengths[0]) >= 6  # the sure row drafts long from its first step
    # The row that left its candidate: once its rejections are seen, drafts stay short.
    assert lengths[1][-1] <= 1
