"""The `suffix` draft source: a tenant's own earlier outputs (bounded, evicted, never another
tenant's) and the request's own tokens."""

from __future__ import annotations

from app.drafting.suffix_index import SuffixIndex, TenantSuffixes, own_match, suffix_draft


def test_the_longest_earlier_match_is_continued() -> None:
    index = SuffixIndex(max_depth=8, max_tokens=1000)
    index.add([1, 2, 3, 4, 5, 6])
    index.add([9, 2, 3, 7, 8])
    # "2 3" last ended in the second output; "1 2 3" only in the first: the longer one wins.
    found = index.match([1, 2, 3], k=2)
    assert found is not None and (found.length, found.tokens) == (3, [4, 5])
    found = index.match([0, 2, 3], k=2)
    assert found is not None and (found.length, found.tokens) == (2, [7, 8])
    assert index.match([42, 43], k=2) is None
    assert index.match([1, 2, 3], k=0) is None


def test_min_match_and_the_end_of_an_output() -> None:
    index = SuffixIndex(max_depth=8, max_tokens=1000, min_match=3)
    index.add([1, 2, 3, 4])
    assert index.match([9, 3], k=4) is None  # one token of context is not enough
    assert index.match([3, 4], k=4) is None  # nothing followed the match
    found = index.match([1, 2, 3], k=4)
    assert found is not None and found.tokens == [4]


def test_memory_is_bounded_and_the_oldest_outputs_go_first() -> None:
    index = SuffixIndex(max_depth=4, max_tokens=10)
    index.add([1, 2, 3, 4, 5])
    index.add([6, 7, 8, 9, 10])
    index.add([11, 12, 13, 14, 15])
    assert index.tokens == 10 and len(index) == 2
    assert index.match([1, 2], k=2) is None  # evicted, with its keys
    found = index.match([11, 12], k=2)
    assert found is not None and found.tokens == [13, 14]
    # The evicted outputs' counts went with them: the counts are those of the kept ones alone.
    fresh = SuffixIndex(max_depth=4, max_tokens=10)
    fresh.add([6, 7, 8, 9, 10])
    fresh.add([11, 12, 13, 14, 15])
    assert index._next == fresh._next


def test_the_most_frequent_continuation_is_drafted_while_its_path_is_likely() -> None:
    index = SuffixIndex(max_depth=8, max_tokens=1000, min_token_prob=0.3)
    for output in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 6, 7], [9, 2, 3, 4, 8]):
        index.add(output)
    # After "1 2 3": 4 twice, 6 once (the latest): the most frequent, 4, with 2/3; after
    # "1 2 3 4": 5 both times.
    found = index.match([1, 2, 3], k=4)
    assert found is not None and found.tokens == [4, 5] and found.odds == (2 / 3, 1.0)
    # After "2 3" alone: 4 three times of four, then "2 3 4": 5 twice, 8 once (0.75 * 2/3 =
    # 0.5), then "2 3 4 5" ends every output it is in.
    found = index.match([0, 2, 3], k=4)
    assert found is not None and found.tokens == [4, 5] and found.odds == (0.75, 2 / 3)
    # A tie goes to the latest: "2 3 4" was followed by 5, 5, 8, and now 8 again.
    index.add([2, 3, 4, 8, 1])
    found = index.match([0, 2, 3, 4], k=4)
    assert found is not None and found.tokens[:2] == [8, 1] and found.odds[0] == 0.5
    # Below the path's bound nothing is drafted: after "3 6" only 7, but "0 3" is unknown
    # and "3" alone went four ways.
    sparse = SuffixIndex(max_depth=8, max_tokens=1000, min_match=1, min_token_prob=0.5)
    for output in ([3, 1], [3, 2], [3, 4], [3, 5]):
        sparse.add(output)
    assert sparse.match([0, 3], k=2) is None


def test_tenants_never_see_each_others_outputs() -> None:
    suffixes = TenantSuffixes(max_depth=8, max_tokens=1000, max_tenants=4)
    secret = [101, 102, 103, 104, 105, 106]  # e.g. a passport number's tokens
    suffixes.of("key-a").add(secret)
    assert suffixes.of("key-b").match([101, 102, 103], k=3) is None
    assert suffixes.of("anonymous").match([101, 102, 103], k=3) is None
    found = suffixes.of("key-a").match([101, 102, 103], k=3)
    assert found is not None and found.tokens == [104, 105, 106]
    assert suffix_draft(suffixes.of("key-b"), [7, 101, 102, 103], 3) == []


def test_the_least_recently_served_tenant_is_dropped() -> None:
    suffixes = TenantSuffixes(max_depth=4, max_tokens=100, max_tenants=2)
    suffixes.of("a").add([1, 2, 3])
    suffixes.of("b").add([4, 5, 6])
    suffixes.of("a")  # a served again: b is now the least recent
    suffixes.of("c")
    assert len(suffixes) == 2
    assert suffixes.of("a").match([1, 2], k=1) is not None
    assert suffixes.of("b").match([4, 5], k=1) is None


def test_own_tokens_longest_tail_on_token_boundaries() -> None:
    assert own_match([5, 1, 2, 3, 9, 7, 1, 2, 3], 2, 1, 8) is not None
    found = own_match([4, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 3, 1, 8)
    # "1 2 3" occurred before, followed by 9: longer than "2 3" followed by 8.
    assert found is not None and (found.length, found.tokens) == (3, [9, 1, 2])
    assert own_match([1, 2, 3], 2, 1, 8) is None
    # Token 1's bytes occur inside 256's and the next token's: not a match of token 1.
    assert own_match([256, 0, 7, 1], 2, 1, 4) is None
    found = own_match([1, 256, 0, 7, 1], 2, 1, 4)  # the aligned occurrence before it counts
    assert found is not None and found.tokens == [256, 0]


def test_own_tokens_copy_on_through_the_present() -> None:
    # A run of whitespace: the longest earlier tail ends one token back, so only one token
    # literally follows it; the draft repeats the run instead of stopping there.
    found = own_match([3, 4, 0, 0, 0, 0], 6, 1, 8)
    assert found is not None and (found.length, found.tokens) == (3, [0] * 6)
    found = own_match([9, 1, 2, 1, 2, 1], 5, 1, 8)
    assert found is not None and (found.length, found.tokens) == (3, [2, 1, 2, 1, 2])


def test_suffix_draft_prefers_the_longer_match_then_the_request_itself() -> None:
    index = SuffixIndex(max_depth=8, max_tokens=100)
    index.add([7, 8, 9, 10, 11])
    assert suffix_draft(index, [1, 7, 8, 9], 2) == [10, 11]  # only the tenant's outputs hold it
    # The request's own tokens hold "8 9" too (followed by 5), as long as the tenant's: its own.
    assert suffix_draft(index, [8, 9, 5, 8, 9], 2) == [5, 8]


def test_scopes_count_against_their_tenants_own_budget() -> None:
    """Issue 39: every scope used to be an index of its own in one LRU of all tenants, so one
    caller's scopes flushed everyone's. Scopes now live within their tenant: they share its
    `max_tokens`, at most `max_scopes` of them, and never take another tenant's place."""
    suffixes = TenantSuffixes(max_depth=4, max_tokens=100, max_tenants=2, max_scopes=3)
    suffixes.add("victim", list(range(50)))
    for scope in range(20):
        suffixes.add("flooder", list(range(1000 + scope * 40, 1040 + scope * 40)), f"s{scope}")
    assert len(suffixes) == 2 and suffixes.tokens("victim") == 50
    assert suffixes.of("victim").match([10, 11, 12], 2) is not None
    assert suffixes.scopes("flooder") == 3  # the newest three scopes
    assert suffixes.tokens("flooder") <= 100
    # The tenant's own index and its scopes share the one budget.
    suffixes.add("victim", list(range(200, 260)), "bench:ooo")
    assert suffixes.tokens("victim") == 60  # its oldest output (its own index's) went
    assert suffixes.of("victim", "bench:ooo").tokens == 60
