from app.engine.alignment import best_continuation, continue_candidate, prompt_lookup

CAND = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def test_prefix_alignment_proposes_the_rest() -> None:
    assert continue_candidate([10, 11, 12], CAND, k=4) == [13, 14, 15, 16]


def test_empty_generation_proposes_from_start() -> None:
    assert continue_candidate([], CAND, k=3) == [10, 11, 12]


def test_draft_is_capped_by_k_and_candidate_end() -> None:
    assert continue_candidate(CAND[:8], CAND, k=16) == [18, 19]
    assert continue_candidate(CAND, CAND, k=16) == []


def test_candidate_arriving_mid_call_after_preamble() -> None:
    generated = [1, 2, 3, 12, 13, 14]
    assert continue_candidate(generated, CAND, k=3) == [15, 16, 17]


def test_short_suffix_match_is_not_trusted() -> None:
    # Only two tokens agree: too weak an anchor in JSON, where '"' and ',' repeat.
    assert continue_candidate([1, 2, 13, 14], CAND, k=3) == []


def test_diverged_output_gives_no_draft() -> None:
    assert continue_candidate([10, 11, 99], CAND, k=3) == []


def test_last_occurrence_wins() -> None:
    cand = [5, 6, 7, 1, 5, 6, 7, 2]
    assert continue_candidate([0, 5, 6, 7], cand, k=1) == [2]


def test_best_continuation_prefers_longest() -> None:
    other = [10, 11, 12, 40]
    assert best_continuation([10, 11, 12], [other, CAND], k=5) == [13, 14, 15, 16, 17]
    assert best_continuation([10, 11, 12], [], k=5) == []


def test_prompt_lookup_finds_latest_ngram() -> None:
    tokens = [1, 2, 3, 4, 9, 9, 1, 2, 3]
    assert prompt_lookup(tokens, k=2, min_n=2, max_n=3) == [4, 9]
    assert prompt_lookup([1, 2, 3], k=2, min_n=2, max_n=3) == []
