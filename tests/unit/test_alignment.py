from app.engine.alignment import best_remainder, candidate_remainder, prompt_lookup

CALL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def test_prefix_gives_the_rest() -> None:
    assert candidate_remainder('[{"name": "get_', CALL) == (CALL[15:], 15)


def test_nothing_generated_gives_the_whole_candidate() -> None:
    assert candidate_remainder("", CALL) == (CALL, 0)


def test_finished_candidate_leaves_only_the_end() -> None:
    assert candidate_remainder(CALL, CALL) == ("", len(CALL))


def test_preamble_then_candidate() -> None:
    free = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    generated = "Sure, let me check.\n<tool_call>\n{\"na"
    assert candidate_remainder(generated, free) == (free[16:], 16)


def test_short_overlap_is_not_trusted() -> None:
    # Only '"}' agrees: too weak an anchor in JSON, where such punctuation repeats.
    assert candidate_remainder('{"x": "a"}', '"}]') is None


def test_diverged_output_gives_none() -> None:
    assert candidate_remainder('[{"name": "get_time"', CALL) is None


def test_best_remainder_prefers_the_candidate_that_agrees() -> None:
    indent = '[\n{\n    "name": "f"\n}\n]'
    one_line = '[\n{"name": "f"}\n]'
    assert best_remainder("[\n{\n ", [one_line, indent]) == indent[5:]
    assert best_remainder("[\n{", [indent, one_line]) == indent[3:]  # tie: first wins
    assert best_remainder("zzz", [indent, one_line]) is None


def test_prompt_lookup_finds_latest_ngram() -> None:
    tokens = [1, 2, 3, 4, 9, 9, 1, 2, 3]
    assert prompt_lookup(tokens, k=2, min_n=2, max_n=3) == [4, 9]
    assert prompt_lookup([1, 2, 3], k=2, min_n=2, max_n=3) == []


def test_realigns_on_a_key_after_an_extra_optional_key() -> None:
    candidate = '{"name": "f", "arguments": {"city": "Paris", "days": 3}}'
    # The main model wrote an optional key the candidate lacks, then went on with "days".
    generated = '{"name": "f", "arguments": {"city": "Paris", "unit": "c", "days": '
    assert (candidate_remainder(generated, candidate) or ("",))[0] == "3}}"


def test_realigns_after_other_whitespace() -> None:
    candidate = '[\n{\n    "name": "f",\n    "arguments": {\n        "city": "Paris"\n    }\n}\n]'
    generated = '[\n{"name": "f", "arguments": {\n    "city": "Pa'
    remainder, _ = candidate_remainder(generated, candidate) or ("", 0)
    assert remainder.startswith('ris"')


def test_realign_off_keeps_only_prefixes() -> None:
    candidate = '{"name": "f", "arguments": {"city": "Paris", "days": 3}}'
    generated = '{"name": "f", "arguments": {"city": "Paris", "unit": "c", "days": '
    assert candidate_remainder(generated, candidate, min_overlap=None) is None
    assert best_remainder(generated, [candidate], realign=False) is None
    assert best_remainder(generated, [candidate]) == "3}}"
    assert best_remainder('{"name": "f"', [candidate], realign=False) == candidate[12:]
