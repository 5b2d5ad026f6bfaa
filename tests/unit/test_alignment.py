from hypothesis import given
from hypothesis import strategies as st

from app.drafting.alignment import best_position, candidate_match, prompt_lookup

CALL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def rest(generated: str, candidate: str, min_overlap: int | None = 8) -> str | None:
    found = candidate_match(generated, candidate, min_overlap)
    return None if found is None else candidate[found[0]:]


def test_prefix_gives_the_rest() -> None:
    assert candidate_match('[{"name": "get_', CALL) == (15, 15)


def test_nothing_generated_gives_the_whole_candidate() -> None:
    assert candidate_match("", CALL) == (0, 0)


def test_finished_candidate_leaves_only_the_end() -> None:
    assert candidate_match(CALL, CALL) == (len(CALL), len(CALL))


def test_preamble_then_candidate() -> None:
    free = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    generated = "Sure, let me check.\n<tool_call>\n{\"na"
    assert candidate_match(generated, free) == (16, 16)


def test_short_overlap_is_not_trusted() -> None:
    # Only '"}' agrees: too weak an anchor in JSON, where such punctuation repeats.
    assert candidate_match('{"x": "a"}', '"}]') is None


def test_diverged_output_gives_none() -> None:
    assert candidate_match('[{"name": "get_time"', CALL) is None


def test_best_position_prefers_the_candidate_that_agrees() -> None:
    indent = '[\n{\n    "name": "f"\n}\n]'
    one_line = '[\n{"name": "f"}\n]'
    assert best_position("[\n{\n ", [one_line, indent]) == (1, 5)
    assert best_position("[\n{", [indent, one_line]) == (0, 3)  # tie: first wins
    assert best_position("zzz", [indent, one_line]) is None


def test_prompt_lookup_finds_latest_ngram() -> None:
    tokens = [1, 2, 3, 4, 9, 9, 1, 2, 3]
    assert prompt_lookup(tokens, k=2, min_n=2, max_n=3) == [4, 9]
    assert prompt_lookup([1, 2, 3], k=2, min_n=2, max_n=3) == []


def test_prompt_lookup_ignores_matches_across_token_bytes() -> None:
    # 256 = bytes 00 01 00.., 0 = 00 00..: [256, 0] holds the bytes of 1 (01 00 ..) off a
    # token boundary; only whole tokens may match.
    assert prompt_lookup([256, 7, 1, 1], k=1, min_n=1, max_n=1) == [1]
    assert prompt_lookup([256, 0, 1], k=1, min_n=1, max_n=1) == []


def _lookup_reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The plain loop the vectorised lookup replaced (vLLM's n-gram rule), with the draft read
    as an overlapping copy: draft token i is token `start + n + i` of the sequence the draft
    extends (the tokens, then the draft itself)."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                extended = list(tokens)
                for i in range(k):
                    extended.append(extended[start + n + i])
                return extended[total:]
    return []


def test_a_repeated_pattern_is_drafted_in_full() -> None:
    # A run of one repeated pair (a model writing ", ," to max_tokens): its most recent
    # occurrence is two tokens back, and the draft copies on through the present.
    tokens = [9, 8, 5, 6, 5, 6, 5, 6]
    assert prompt_lookup(tokens, k=5, min_n=2, max_n=4) == [5, 6, 5, 6, 5]
    assert prompt_lookup([7, 7], k=3, min_n=1, max_n=1) == [7, 7, 7]


@given(st.lists(st.one_of(st.integers(0, 3), st.integers(0, 70_000)), max_size=40),
       st.integers(1, 5), st.integers(1, 3), st.integers(0, 3))
def test_prompt_lookup_agrees_with_the_plain_loop(
    tokens: list[int], k: int, min_n: int, extra: int
) -> None:
    assert prompt_lookup(tokens, k, min_n, min_n + extra) == _lookup_reference(
        tokens, k, min_n, min_n + extra)


def _match_reference(generated: str, candidate: str, min_overlap: int) -> tuple[int, int] | None:
    """Suffixes grown one character at a time, each searched whole (the first version)."""
    if candidate.startswith(generated):
        return len(generated), len(generated)
    best: tuple[int, int] | None = None
    n = len(generated)
    for size in range(min_overlap, min(n, len(candidate)) + 1):
        start = candidate.rfind(generated[n - size:])
        if start < 0:
            break
        best = (start + size, size)
    return best


@given(st.text(alphabet='ab{}": ,', max_size=30), st.text(alphabet='ab{}": ,', max_size=30),
       st.integers(1, 4))
def test_candidate_match_agrees_with_growing_suffixes(
    generated: str, candidate: str, min_overlap: int
) -> None:
    assert candidate_match(generated, candidate, min_overlap) == _match_reference(
        generated, candidate, min_overlap)


def test_realigns_on_a_key_after_an_extra_optional_key() -> None:
    candidate = '{"name": "f", "arguments": {"city": "Paris", "days": 3}}'
    # The main model wrote an optional key the candidate lacks, then went on with "days".
    generated = '{"name": "f", "arguments": {"city": "Paris", "unit": "c", "days": '
    assert rest(generated, candidate) == "3}}"


def test_realigns_after_other_whitespace() -> None:
    candidate = '[\n{\n    "name": "f",\n    "arguments": {\n        "city": "Paris"\n    }\n}\n]'
    generated = '[\n{"name": "f", "arguments": {\n    "city": "Pa'
    assert (rest(generated, candidate) or "").startswith('ris"')


def test_realign_off_keeps_only_prefixes() -> None:
    candidate = '{"name": "f", "arguments": {"city": "Paris", "days": 3}}'
    generated = '{"name": "f", "arguments": {"city": "Paris", "unit": "c", "days": '
    assert rest(generated, candidate, min_overlap=None) is None
    assert best_position(generated, [candidate], realign=False) is None
    assert best_position(generated, [candidate]) == (0, len(candidate) - 3)
    assert best_position('{"name": "f"', [candidate], realign=False) == (0, 12)


@given(st.text(alphabet='ab{}": ,', max_size=30),
       st.lists(st.text(alphabet='ab{}": ,', max_size=30), max_size=5), st.booleans())
def test_best_position_is_the_longest_match_first_wins(
    generated: str, candidates: list[str], realign: bool
) -> None:
    """The quick skip of candidates that cannot match changes nothing."""
    best, best_size = None, 0
    for index, candidate in enumerate(candidates):
        found = candidate_match(generated, candidate, 8 if realign else None)
        if found is not None and (best is None or found[1] > best_size):
            best, best_size = (index, found[0]), found[1]
    assert best_position(generated, candidates, realign) == best
