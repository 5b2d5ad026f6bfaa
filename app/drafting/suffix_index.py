"""The `suffix` draft source: a tenant's own earlier outputs, and the request's own tokens.

Agents repeat themselves deep in a conversation: the same tools again, arguments copied from
earlier results, a call that repeats an earlier one with one value changed. Suffix decoding
(SuffixDecoding, arXiv 2411.04975; vLLM's `suffix` method) drafts what followed the longest
earlier occurrence of the output's last tokens. vLLM keeps one tree of every caller's outputs;
here each tenant has its own index, so one tenant's outputs are never drafted for another
(nor do its acceptance counts or timings say anything about another's).

`SuffixIndex` is a depth-limited suffix trie of a tenant's outputs stored flat: every n-gram of
up to `max_depth` tokens maps to where it last ended (an output and a position). The longest
match of the output's tail grows one token at a time and stops at the first miss (if an
n-gram occurs, so does its (n-1)-token suffix, ending at the same place), so a lookup is at
most `max_depth` dict probes, and adding an output of L tokens is L * `max_depth` inserts.
Keys are the n-grams' hashes: a collision drafts wrong tokens, which the main model rejects;
it never changes an output, and never crosses tenants (each tenant has its own dict).
Memory is bounded by `max_tokens` per tenant (oldest outputs evicted first, with the keys
that still point at them) and `max_tenants` (least recently used tenant dropped whole).

`own_match` is the same idea over the request's own prompt and output (the current prompt's
tool descriptions and earlier tool results), as a binary search over the match length; a
match that runs into the present is copied on (`alignment.tail_follow`), so a repeated
pattern in the output is drafted in full.

Pure Python without `arctic-inference`, on purpose: the product must not depend on a native
build to serve. Writers (a finished request) and the reader (the proposer on the engine's step
thread) meet under one lock per tenant.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.drafting.alignment import tail_follow


@dataclass(frozen=True)
class SuffixMatch:
    """A draft and the length (in tokens) of the context it continues."""

    length: int
    tokens: list[int]


class SuffixIndex:
    """One tenant's earlier outputs, bounded to `max_tokens` tokens. `min_match`: the
    shortest context a draft may continue (the proposer reads it)."""

    def __init__(self, max_depth: int, max_tokens: int, min_match: int = 2) -> None:
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._lock = threading.Lock()
        self._outputs: dict[int, list[int]] = {}
        self._order: deque[int] = deque()
        self._next_id = 0
        self._tokens = 0
        # hash(n-gram) -> (output id, index just after the n-gram's last token)
        self._ends: dict[int, tuple[int, int]] = {}

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one output (the oldest ones go once `max_tokens` is exceeded)."""
        output = [int(t) for t in tokens][-self.max_tokens:]
        if len(output) < 2:
            return
        with self._lock:
            output_id = self._next_id
            self._next_id += 1
            self._outputs[output_id] = output
            self._order.append(output_id)
            self._tokens += len(output)
            for end in range(1, len(output) + 1):
                for n in range(1, min(self.max_depth, end) + 1):
                    self._ends[hash(tuple(output[end - n:end]))] = (output_id, end)
            while self._tokens > self.max_tokens:
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        old_id = self._order.popleft()
        old = self._outputs.pop(old_id)
        self._tokens -= len(old)
        for end in range(1, len(old) + 1):
            for n in range(1, min(self.max_depth, end) + 1):
                key = hash(tuple(old[end - n:end]))
                found = self._ends.get(key)
                if found is not None and found[0] == old_id:
                    del self._ends[key]

    def match(self, context: Sequence[int] | np.ndarray, k: int) -> SuffixMatch | None:
        """Up to `k` tokens that followed the longest earlier occurrence of `context`'s last
        tokens (at least `min_match` of them, at most `max_depth`)."""
        if k <= 0:
            return None
        tail = [int(t) for t in context[-self.max_depth:]]
        best: tuple[int, int, int] | None = None  # (length, output id, end)
        with self._lock:
            for n in range(1, len(tail) + 1):
                found = self._ends.get(hash(tuple(tail[len(tail) - n:])))
                if found is None:
                    break
                if n >= self.min_match:
                    output = self._outputs[found[0]]
                    if found[1] < len(output):  # something follows it
                        best = (n, found[0], found[1])
            if best is None:
                return None
            length, output_id, end = best
            return SuffixMatch(length, self._outputs[output_id][end:end + k])

    @property
    def tokens(self) -> int:
        with self._lock:
            return self._tokens

    def __len__(self) -> int:
        with self._lock:
            return len(self._outputs)


class TenantSuffixes:
    """Each tenant's `SuffixIndex`, at most `max_tenants` of them (least recently used
    dropped)."""

    def __init__(self, max_depth: int, max_tokens: int, max_tenants: int,
                 min_match: int = 2) -> None:
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.max_tenants = max_tenants
        self.min_match = min_match
        self._lock = threading.Lock()
        self._tenants: OrderedDict[str, SuffixIndex] = OrderedDict()

    def of(self, tenant: str) -> SuffixIndex:
        with self._lock:
            index = self._tenants.get(tenant)
            if index is None:
                index = self._tenants[tenant] = SuffixIndex(self.max_depth, self.max_tokens,
                                                             self.min_match)
                if len(self._tenants) > self.max_tenants:
                    self._tenants.popitem(last=False)
            else:
                self._tenants.move_to_end(tenant)
            return index

    def __len__(self) -> int:
        with self._lock:
            return len(self._tenants)


def own_match(
    tokens: Sequence[int] | np.ndarray, k: int, min_length: int, max_length: int
) -> SuffixMatch | None:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest tail
    (between `min_length` and `max_length` tokens) of the request's own `tokens`.

    >>> own_match([5, 1, 2, 3, 9, 7, 1, 2, 3], 2, 1, 8)
    SuffixMatch(length=3, tokens=[9, 7])
    """
    seq = np.ascontiguousarray(tokens, dtype=np.int64)
    data = seq.tobytes()
    low, high = min_length, min(max_length, len(seq) - 1)
    best: SuffixMatch | None = None
    # An n-token tail occurring earlier implies its shorter tails do: binary search on n.
    while low <= high:
        n = (low + high) // 2
        follow = tail_follow(seq, data, n, k)
        if follow is None:
            high = n - 1
        else:
            if follow:
                best = SuffixMatch(n, follow)
            low = n + 1
    return best


def suffix_draft(index: SuffixIndex, context: Sequence[int] | np.ndarray, k: int) -> list[int]:
    """The `suffix` source's draft: the longer match of the tenant's earlier outputs and of the
    request's own tokens (its own, on a tie: the current conversation is the closer one)."""
    theirs = index.match(context[-index.max_depth:], k)
    own = own_match(context, k, index.min_match, index.max_depth)
    if own is not None and (theirs is None or own.length >= theirs.length):
        return own.tokens
    return theirs.tokens if theirs is not None else []
