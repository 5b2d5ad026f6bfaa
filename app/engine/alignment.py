"""Token-level alignment of a request's generated tokens with its candidate continuations.

Pure functions: the proposer calls them once per request per engine step, so they work on
plain lists and stay cheap (candidates are ~30-100 tokens, drafts at most `k`).
"""

from __future__ import annotations

from collections.abc import Sequence

# A single shared token ('"', ',', ':') matches in many places of a JSON call; anchoring on
# fewer than this many tokens would draft from the wrong place more often than not.
MIN_SUFFIX_MATCH = 3


def continue_candidate(
    generated: Sequence[int], candidate: Sequence[int], k: int, min_match: int = MIN_SUFFIX_MATCH
) -> list[int]:
    """Return up to `k` tokens of `candidate` that should follow `generated`.

    Two anchors, tried in order:
    1. `generated` is a prefix of `candidate` (the usual case: the candidate arrived before or
       while the main model was writing the call);
    2. the longest suffix of `generated` (at least `min_match` tokens) that occurs in
       `candidate`; the last occurrence wins, because a call is written left to right and the
       latest place is the one the main model is at. This covers a candidate that arrives
       mid-call after a preamble, and a call that resumes after a divergent token run.
    """
    if k <= 0 or not candidate:
        return []
    n = len(generated)
    if n <= len(candidate) and list(candidate[:n]) == list(generated):
        return list(candidate[n : n + k])
    best_end = -1
    best_len = 0
    max_len = min(n, len(candidate))
    # Grow the suffix while it still matches somewhere; stop at the first length without a
    # match because a longer suffix contains the shorter one.
    for length in range(min_match, max_len + 1):
        suffix = list(generated[n - length :])
        end = _last_occurrence_end(candidate, suffix)
        if end < 0:
            break
        best_end, best_len = end, length
    if best_len == 0 or best_end >= len(candidate):
        return []
    return list(candidate[best_end : best_end + k])


def _last_occurrence_end(haystack: Sequence[int], needle: Sequence[int]) -> int:
    """Index just past the last occurrence of `needle` in `haystack`, or -1."""
    m = len(needle)
    for start in range(len(haystack) - m, -1, -1):
        if list(haystack[start : start + m]) == list(needle):
            return start + m
    return -1


def best_continuation(
    generated: Sequence[int], candidates: Sequence[Sequence[int]], k: int
) -> list[int]:
    """The longest continuation any candidate offers (ties: the earlier candidate)."""
    best: list[int] = []
    for candidate in candidates:
        draft = continue_candidate(generated, candidate, k)
        if len(draft) > len(best):
            best = draft
    return best


def prompt_lookup(tokens: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM-style n-gram prompt lookup over one request's own tokens (prompt + output).

    Finds the most recent earlier occurrence of the last n tokens (n from `max_n` down to
    `min_n`) and proposes what followed it.
    """
    total = len(tokens)
    seq = list(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = seq[total - n :]
        for start in range(total - n - 1, -1, -1):
            if seq[start : start + n] == suffix:
                follow = seq[start + n : start + n + k]
                if follow:
                    return follow
    return []
