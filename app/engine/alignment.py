"""Alignment of a request's generated text with its candidate texts, and prompt lookup.

Alignment works on text, not token ids: under a grammar the main model often splits a forced
string (a tool name) into other tokens than the tokenizer would, and token-level matching then
loses its place for the rest of the call. Text survives any token split, so the proposer finds
where the model is in the candidate, tokenizes only the rest, and drafts that.

Pure functions: the proposer calls them once per request per engine step on short strings.
"""

from __future__ import annotations

from collections.abc import Sequence

# Anchoring on a shorter overlap than this (when the output does not simply start with the
# candidate) matches punctuation that occurs everywhere in JSON and drafts from a wrong place.
MIN_OVERLAP_CHARS = 8


def candidate_remainder(
    generated: str, candidate: str, min_overlap: int | None = MIN_OVERLAP_CHARS
) -> tuple[str, int] | None:
    """Where `generated` is in `candidate`: (text still to come, length of the match).

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
    """
    if candidate.startswith(generated):
        return candidate[len(generated) :], len(generated)
    if min_overlap is None:
        return None
    best_end = -1
    best_size = 0
    n = len(generated)
    # Grow the suffix while it still occurs: a longer suffix contains the shorter one, so the
    # first size without an occurrence ends the search.
    for size in range(min_overlap, min(n, len(candidate)) + 1):
        start = candidate.rfind(generated[n - size :])
        if start < 0:
            break
        best_end, best_size = start + size, size
    if best_size == 0:
        return None
    return candidate[best_end:], best_size


def best_remainder(
    generated: str, candidates: Sequence[str], realign: bool = True
) -> str | None:
    """The remainder of the candidate that agrees with most of the output (ties: first).

    A candidate already written in full gives "" (only the end of the output is left).
    `realign=False`: prefixes only (to measure what re-alignment is worth)."""
    best: tuple[str, int] | None = None
    min_overlap = MIN_OVERLAP_CHARS if realign else None
    for candidate in candidates:
        found = candidate_remainder(generated, candidate, min_overlap)
        if found is not None and (best is None or found[1] > best[1]):
            best = found
    return None if best is None else best[0]


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
