"""The `suffix` draft source: a tenant's own earlier outputs, and the request's own tokens.

Agents repeat themselves deep in a conversation: the same tools again, arguments copied from
earlier results, a call that repeats an earlier one with one value changed. Suffix decoding
(SuffixDecoding, arXiv 2411.04975; vLLM's `suffix` method) drafts what followed the longest
earlier occurrence of the output's last tokens. vLLM keeps one tree of every caller's outputs;
here each tenant has its own index, so one tenant's outputs are never drafted for another
(nor do its acceptance counts or timings say anything about another's).

`SuffixIndex` is a depth-limited suffix trie of a tenant's outputs stored flat: every n-gram of
up to `max_depth` tokens maps to the tokens that followed it and how often (its children with
their counts). The longest match of the output's tail grows one token at a time and stops at
the first miss (if an n-gram was followed by something, so was its (n-1)-token suffix), so a
lookup is at most `max_depth` dict probes, and adding an output of L tokens is L * `max_depth`
count updates. The draft then walks down from the match as vLLM's suffix decoding walks its
tree: each step takes the most frequent child (the most recent one on a tie), whose share of
the node's count is its chance (`SuffixMatch.odds`), and stops once the path's chance (their
product) falls below `min_token_prob` (vLLM's `suffix_decoding_min_token_prob`, 0.1): where the
tenant's outputs went different ways, the draft is short and says how sure it is. Following
only the most recent occurrence, a draft ran on through a fork its outputs took both ways.
Keys are the n-grams' hashes: a collision drafts wrong tokens, which the main model rejects;
it never changes an output, and never crosses tenants (each tenant has its own dict).
Memory is bounded by `max_tokens` per tenant, over its own index and its scopes' together
(oldest outputs evicted first, their counts taken back), and `max_tenants` (least recently
used tenant dropped whole, its scopes with it).

`own_match` is the same idea over the request's own prompt and output (the current prompt's
tool descriptions and earlier tool results), as a binary search over the match length; a
match that runs into the present is copied on (`alignment.tail_follow`), so a repeated
pattern in the output is drafted in full.

Pure Python without `arctic-inference`, on purpose: the product must not depend on a native
build to serve. Writers (a finished request) and the reader (the proposer on the engine's step
thread) meet under one lock per tenant.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from app.drafting.alignment import tail_follow

# Stamps of the outputs every index keeps, in the order they were added (`SuffixIndex.oldest`).
_OUTPUT_IDS = itertools.count()


# vLLM's `suffix_decoding_min_token_prob`: a draft stops where its path is less likely.
MIN_TOKEN_PROB = 0.1


@dataclass(frozen=True)
class SuffixMatch:
    """A draft, the length (in tokens) of the context it continues, and each drafted token's
    chance given the ones before it, from the counts (empty: not counted, e.g. the request's
    own tokens)."""

    length: int
    tokens: list[int]
    odds: tuple[float, ...] = ()


class SuffixIndex:
    """One tenant's earlier outputs, bounded to `max_tokens` tokens. `min_match`: the
    shortest context a draft may continue (the proposer reads it)."""

    def __init__(self, max_depth: int, max_tokens: int, min_match: int = 2,
                 min_token_prob: float = MIN_TOKEN_PROB) -> None:
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.min_match = min_match
        self.min_token_prob = min_token_prob
        self._lock = threading.Lock()
        self._outputs: dict[int, list[int]] = {}
        self._order: deque[int] = deque()
        self._tokens = 0
        # hash(n-gram) -> {token that followed it: count}, the latest-counted token last.
        self._next: dict[int, dict[int, int]] = {}

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one output (the oldest ones go once `max_tokens` is exceeded)."""
        output = [int(t) for t in tokens][-self.max_tokens:]
        if len(output) < 2:
            return
        with self._lock:
            output_id = next(_OUTPUT_IDS)  # ordered across indexes: a tenant's oldest output
            self._outputs[output_id] = output
            self._order.append(output_id)
            self._tokens += len(output)
            for key, follower in self._followed(output):
                children = self._next.setdefault(key, {})
                children[follower] = children.pop(follower, 0) + 1
            while self._tokens > self.max_tokens:
                self._evict_oldest()

    def oldest(self) -> int | None:
        """The stamp of the oldest output kept (stamps grow across all indexes), or None."""
        with self._lock:
            return self._order[0] if self._order else None

    def evict_oldest(self) -> bool:
        """Forget the oldest output (False: none left)."""
        with self._lock:
            if not self._order:
                return False
            self._evict_oldest()
            return True

    def _evict_oldest(self) -> None:
        old_id = self._order.popleft()
        old = self._outputs.pop(old_id)
        self._tokens -= len(old)
        for key, follower in self._followed(old):
            children = self._next.get(key)
            if children is None or follower not in children:
                continue  # a hash collision took it already
            children[follower] -= 1
            if children[follower] <= 0:
                del children[follower]
                if not children:
                    del self._next[key]

    def _followed(self, output: list[int]) -> Iterator[tuple[int, int]]:
        """Each n-gram of `output` (up to `max_depth` tokens, as its hash) that some token
        followed, with that token: what `add` counts and eviction takes back."""
        for end in range(1, len(output)):
            for n in range(1, min(self.max_depth, end) + 1):
                yield hash(tuple(output[end - n:end])), output[end]

    def match(self, context: Sequence[int] | np.ndarray, k: int) -> SuffixMatch | None:
        """Up to `k` tokens down the trie from the longest earlier occurrence of `context`'s
        last tokens (at least `min_match` of them, at most `max_depth`): the most frequent
        child each time, while the path's chance stays at least `min_token_prob`."""
        if k <= 0:
            return None
        tail = [int(t) for t in context[-self.max_depth:]]
        with self._lock:
            length = 0
            for n in range(1, len(tail) + 1):
                if hash(tuple(tail[len(tail) - n:])) not in self._next:
                    break
                length = n
            if length < self.min_match:
                return None
            window = tail[len(tail) - length:]
            tokens: list[int] = []
            odds: list[float] = []
            path = 1.0
            while len(tokens) < k:
                children = self._next.get(hash(tuple(window[-self.max_depth:])))
                if not children:
                    break
                token, count = _most_frequent(children)
                chance = count / sum(children.values())
                if path * chance < self.min_token_prob:
                    break
                path *= chance
                tokens.append(token)
                odds.append(chance)
                window.append(token)
        return SuffixMatch(length, tokens, tuple(odds)) if tokens else None

    @property
    def tokens(self) -> int:
        with self._lock:
            return self._tokens

    def __len__(self) -> int:
        with self._lock:
            return len(self._outputs)


def _most_frequent(children: dict[int, int]) -> tuple[int, int]:
    """The child with the highest count; on a tie, the latest counted (dicts keep the order
    counts were last raised in, see `SuffixIndex.add`).

    >>> _most_frequent({5: 2, 7: 1, 9: 2})
    (9, 2)
    """
    best = (0, 0)
    for token, count in children.items():
        if count >= best[1]:
            best = (token, count)
    return best


class TenantSuffixes:
    """Each tenant's suffix indexes, for at most `max_tenants` tenants (the least recently
    used tenant dropped whole): its own, and up to `max_scopes` scoped ones within it (a
    benchmark's per-mode index, `ooo_spec.diagnostics.suffix_scope`; its least recently used
    scope dropped). A tenant's indexes share its `max_tokens` (`add`), so scopes never take
    memory, nor a place among the tenants, from another tenant."""

    def __init__(self, max_depth: int, max_tokens: int, max_tenants: int,
                 min_match: int = 2, max_scopes: int = 8,
                 min_token_prob: float = MIN_TOKEN_PROB) -> None:
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.max_tenants = max_tenants
        self.min_match = min_match
        self.min_token_prob = min_token_prob
        self.max_scopes = max_scopes
        self._lock = threading.Lock()
        # tenant -> its indexes by scope (None: its own), least recently used first.
        self._tenants: OrderedDict[str, OrderedDict[str | None, SuffixIndex]] = OrderedDict()

    def of(self, tenant: str, scope: str | None = None) -> SuffixIndex:
        with self._lock:
            scopes = self._tenants.get(tenant)
            if scopes is None:
                scopes = self._tenants[tenant] = OrderedDict()
                if len(self._tenants) > self.max_tenants:
                    self._tenants.popitem(last=False)
            else:
                self._tenants.move_to_end(tenant)
            index = scopes.get(scope)
            if index is None:
                index = scopes[scope] = SuffixIndex(self.max_depth, self.max_tokens,
                                                     self.min_match, self.min_token_prob)
                named = [name for name in scopes if name is not None]
                if len(named) > self.max_scopes:
                    del scopes[named[0]]
            else:
                scopes.move_to_end(scope)
            return index

    def add(self, tenant: str, tokens: Sequence[int], scope: str | None = None) -> None:
        """Remember one output in the tenant's (or its scope's) index; then, while the
        tenant's indexes hold more than `max_tokens` together, its oldest output (in whichever
        index) goes."""
        self.of(tenant, scope).add(tokens)
        with self._lock:
            indexes = list(self._tenants.get(tenant, {}).values())
        while sum(index.tokens for index in indexes) > self.max_tokens:
            stamped = [(stamp, i) for i, index in enumerate(indexes)
                       if (stamp := index.oldest()) is not None]
            if not stamped:
                break
            indexes[min(stamped)[1]].evict_oldest()

    def scopes(self, tenant: str) -> int:
        """Indexes `tenant` holds (its own and its scopes')."""
        with self._lock:
            return len(self._tenants.get(tenant, ()))

    def tokens(self, tenant: str) -> int:
        """Tokens `tenant`'s indexes hold together."""
        with self._lock:
            indexes = list(self._tenants.get(tenant, {}).values())
        return sum(index.tokens for index in indexes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tenants)


def own_match(
    tokens: Sequence[int] | np.ndarray, k: int, min_length: int, max_length: int
) -> SuffixMatch | None:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest tail
    (between `min_length` and `max_length` tokens) of the request's own `tokens`.

    >>> own_match([5, 1, 2, 3, 9, 7, 1, 2, 3], 2, 1, 8)
    SuffixMatch(length=3, tokens=[9, 7], odds=())
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
    """The `suffix` source's draft (`suffix_match`'s tokens)."""
    found = suffix_match(index, context, k)
    return found.tokens if found is not None else []


def suffix_match(
    index: SuffixIndex, context: Sequence[int] | np.ndarray, k: int
) -> SuffixMatch | None:
    """The `suffix` source's match: the longer of the tenant's earlier outputs' and the
    request's own tokens' (its own, on a tie: the current conversation is the closer one)."""
    theirs = index.match(context[-index.max_depth:], k)
    own = own_match(context, k, index.min_match, index.max_depth)
    if own is not None and (theirs is None or own.length >= theirs.length):
        return own
    return theirs
