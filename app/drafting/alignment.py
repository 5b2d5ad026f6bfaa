"""Alignment of a request's generated text with its candidate texts, and prompt lookup.

Alignment works on text, not token ids: under a grammar the main model often splits a forced
string (a tool name) into other tokens than the tokenizer would, and token-level matching then
loses its place for the rest of the call. Text survives any token split, so the proposer finds
where the model is in the candidate, tokenizes only the rest, and drafts that.

Pure functions: the proposer calls them once per request per engine step on short strings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Anchoring on a shorter overlap than this (when the output does not simply start with the
# candidate) matches punctuation that occurs everywhere in JSON and drafts from a wrong place.
MIN_OVERLAP_CHARS = 8


def candidate_match(
    generated: str, candidate: str, min_overlap: int | None = MIN_OVERLAP_CHARS
) -> tuple[int, int] | None:
    """Where `generated` stands in `candidate`: (position in `candidate` the output continues
    at, length of the match).

    Two anchors, tried in order:
    1. `candidate` starts with `generated` (the usual case, also when the candidate arrives
       mid-call: the model has simply written more of it already);
    2. re-alignment: the longest suffix of `generated` (at least `min_overlap` chars) found
       anywhere in `candidate`, its last occurrence winning. After the model leaves the
       candidate — another whitespace, an optional key the candidate lacks, text before
       `<tool_call>` — this picks the candidate up again as soon as the model writes a key of
       it (`"city": ` is already 8 chars), and drafts that key's value and the rest.
    None when neither holds (the model has left the candidate). `min_overlap=None` turns
    re-alignment off (prefix only).

    >>> candidate_match('{"city": "Rome", "days": ', '{"city": "Paris", "days": 3}')
    (26, 11)
    """
    if candidate.startswith(generated):
        return len(generated), len(generated)
    n = len(generated)
    if min_overlap is None or n < min_overlap:
        return None
    tail = generated[n - min_overlap :]
    best_end, best_size = -1, 0
    # Every longer matching suffix ends with `tail`: visit the tail's occurrences from the
    # last one back and measure how far each agrees; strictly longer wins, so ties keep the
    # last occurrence.
    start = candidate.rfind(tail)
    while start >= 0:
        end = start + min_overlap
        size = _common_suffix(generated, candidate, end, min_overlap)
        if size > best_size:
            best_end, best_size = end, size
        start = candidate.rfind(tail, 0, end - 1)
    return None if best_size == 0 else (best_end, best_size)


def _common_suffix(generated: str, candidate: str, end: int, known: int) -> int:
    """Length of the common suffix of `generated` and `candidate[:end]`, at least `known`
    (binary search: a suffix that agrees means every shorter one agrees)."""
    n = len(generated)
    low, high = known, min(n, end)
    while low < high:
        mid = (low + high + 1) // 2
        if candidate[end - mid : end] == generated[n - mid :]:
            low = mid
        else:
            high = mid - 1
    return low


def best_position(
    generated: str, candidates: Sequence[str], realign: bool = True
) -> tuple[int, int] | None:
    """(index, character position) in the candidate that agrees with most of the output: the
    output continues there. Ties go to the first candidate; None when none agrees.

    `realign=False`: prefixes only (to measure what re-alignment is worth)."""
    if not generated:  # every candidate agrees with nothing written yet: the first wins
        return (0, 0) if candidates else None
    best: tuple[int, int] | None = None
    best_size = 0
    min_overlap = MIN_OVERLAP_CHARS if realign else None
    # Any match needs the candidate to start with the output or to hold its last
    # `min_overlap` characters: one C-level test skips most candidates (this runs per row on
    # the engine's step thread whenever a row has lost its place).
    tail = generated[-MIN_OVERLAP_CHARS:] if realign and len(generated) >= MIN_OVERLAP_CHARS \
        else None
    for index, candidate in enumerate(candidates):
        if (tail is None or tail not in candidate) and not candidate.startswith(generated):
            continue
        found = candidate_match(generated, candidate, min_overlap)
        if found is not None and (best is None or found[1] > best_size):
            best, best_size = (index, found[0]), found[1]
    return best


def prompt_lookup(tokens: Sequence[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM-style n-gram prompt lookup's draft (`prompt_lookup_match`)."""
    return prompt_lookup_match(tokens, k, min_n, max_n)[1]


def prompt_lookup_match(
    tokens: Sequence[int] | np.ndarray, k: int, min_n: int, max_n: int
) -> tuple[int, list[int]]:
    """vLLM-style n-gram prompt lookup over one request's own tokens (prompt + output): the
    n it matched (0: none) and the draft.

    Finds the most recent earlier occurrence of the last n tokens (n from `max_n` down to
    `min_n`) and proposes what followed it (`continuation`: copied on where it runs into the
    present). The search runs on the tokens' bytes
    (`bytes.rfind`, in C): the proposer calls this on every row without a candidate draft, on
    prompts of thousands of tokens.
    """
    seq = np.ascontiguousarray(tokens, dtype=np.int64)
    data = seq.tobytes()
    for n in range(min(max_n, len(seq) - 1), min_n - 1, -1):
        if n <= 0:
            break
        follow = tail_follow(seq, data, n, k)
        if follow is not None:
            return n, follow
    return 0, []


def tail_follow(seq: np.ndarray, data: bytes, n: int, k: int) -> list[int] | None:
    """What followed the most recent earlier occurrence of `seq`'s last `n` tokens, copied on
    past the present (`continuation`); None: no such occurrence. `data` is `seq.tobytes()`,
    made once by the caller for all the `n` it tries."""
    width = seq.itemsize
    total = len(seq)
    needle = data[(total - n) * width:]
    # An earlier occurrence ends before the last token: search data[: (total - 1) * width].
    end = (total - 1) * width
    while True:
        found = data.rfind(needle, 0, end)
        if found < 0:
            return None
        if found % width == 0:  # on a token boundary, not inside two tokens' bytes
            return continuation(seq, found // width + n, k)
        end = found + len(needle) - 1


def continuation(seq: np.ndarray, at: int, k: int) -> list[int]:
    """Up to `k` tokens that follow position `at` of `seq` (0 < `at` < len(seq)), copied
    on past the end of `seq` as an overlapping copy (LZ77's): a match `d` tokens back runs into
    the tokens being predicted now, which are then predicted to repeat with period `d`. A
    repeated pattern (a run of whitespace, a list of similar items) gets a full draft, where
    what literally follows its most recent occurrence is only `d` tokens long.

    >>> continuation(np.array([7, 1, 2, 1, 2]), 3, 5)
    [1, 2, 1, 2, 1]
    >>> continuation(np.array([5, 6, 7, 8]), 1, 2)
    [6, 7]
    """
    follow = [int(t) for t in seq[at:at + k]]
    period = len(seq) - at
    while len(follow) < k:
        follow.append(follow[len(follow) - period])
    return follow
