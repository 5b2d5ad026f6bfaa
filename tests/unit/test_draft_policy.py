from app.config import LoadAwareConfig, SpeculationConfig
from app.drafting.draft_policy import DraftPolicy, RowAcceptance, platform_budgets


def test_small_batches_get_the_full_k_and_large_ones_share_the_step() -> None:
    policy = DraftPolicy(k=16, step_draft_tokens=128, no_draft_batch=64)
    assert policy.batch_budget(1) == 16
    assert policy.batch_budget(8) == 16
    assert policy.batch_budget(32) == 4
    assert policy.batch_budget(63) == 2
    assert policy.batch_budget(200 // 2) == 0  # at no_draft_batch and above: none
    assert DraftPolicy(k=16, step_draft_tokens=4).batch_budget(10) == 1  # at least one


def test_policy_from_config() -> None:
    config = SpeculationConfig.model_validate(
        {"num_speculative_tokens": 8, "load_aware": {"step_draft_tokens": 32, "reject_streak": 2}})
    policy = DraftPolicy.from_config(config, "cpu")
    assert (policy.k, policy.step_draft_tokens, policy.reject_streak) == (8, 32, 2)
    assert policy.no_draft_batch == platform_budgets(LoadAwareConfig(), "cpu")[1]


def test_unset_budgets_follow_the_platform() -> None:
    """CPU verifies few drafts per step (compute grows with a pass's tokens); a GPU's
    memory-bound decode step takes many. Set values win on both."""
    cpu = DraftPolicy.from_config(SpeculationConfig(), "cpu")
    gpu = DraftPolicy.from_config(SpeculationConfig(), "cuda")
    assert cpu.step_draft_tokens < gpu.step_draft_tokens
    assert cpu.no_draft_batch < gpu.no_draft_batch
    assert cpu.batch_budget(1) == gpu.batch_budget(1) == 16  # one user: the full k on both
    assert cpu.batch_budget(16) == 0 and gpu.batch_budget(16) == 16
    set_both = LoadAwareConfig(step_draft_tokens=64, no_draft_batch=32)
    assert platform_budgets(set_both, "cpu") == platform_budgets(set_both, "cuda") == (64, 32)


def test_rejected_streak_pauses_then_drafting_resumes() -> None:
    policy = DraftPolicy(k=4, reject_streak=2, pause_steps=3)
    row = RowAcceptance()
    row.drafted = 4
    row.observe(sampled=1, policy=policy)  # all rejected: streak 1
    assert not row.paused
    row.drafted = 4
    row.observe(sampled=1, policy=policy)  # streak 2: pause
    assert row.paused
    for _ in range(2):
        row.observe(sampled=1, policy=policy)
        assert row.paused
    row.observe(sampled=1, policy=policy)
    assert not row.paused  # three steps sat out


def test_an_accepted_token_resets_the_streak() -> None:
    policy = DraftPolicy(k=4, reject_streak=2, pause_steps=3)
    row = RowAcceptance()
    for sampled in (1, 3, 1, 2, 1):  # never two rejections in a row
        row.drafted = 4
        row.observe(sampled=sampled, policy=policy)
        assert not row.paused


def test_steps_without_drafts_do_not_count_as_rejections() -> None:
    policy = DraftPolicy(k=4, reject_streak=1, pause_steps=5)
    row = RowAcceptance()
    for _ in range(5):
        row.observe(sampled=1, policy=policy)  # nothing drafted
    assert not row.paused
