"""The proposer's per-request tracking, with a small greedy tokenizer and the embedded one."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import app.drafting.request_alignment as ra
from app.drafting.request_alignment import TokenizedCandidate, TokenizedCandidates, TrackedRequest

VOCAB = ['{"', "city", '":', ' "', "Paris", '"}', "ci", "ty", "Pa", "ris", "Ro", "me"]


class Greedy:
    """Longest match first over VOCAB, then single characters (ids 1000 + codepoint)."""

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            word = max((w for w in VOCAB if text.startswith(w, i)), key=len, default=None)
            if word is None:
                ids.append(1000 + ord(text[i]))
                i += 1
            else:
                ids.append(VOCAB.index(word))
                i += len(word)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(VOCAB[i] if i < 1000 else chr(i - 1000) for i in ids)

    def tokenize(self, text: str) -> TokenizedCandidate:
        ids = self.encode(text)
        return TokenizedCandidate.from_pieces(text, ids, [self.decode([i]) for i in ids])


def candidates_of(tok: Greedy) -> TokenizedCandidates:
    return TokenizedCandidates(tok.tokenize, tok.encode)


def test_offsets_that_tile_the_text_give_starts() -> None:
    assert TokenizedCandidate.from_offsets("abcd", [1, 2], [(0, 2), (2, 4)]) == \
        TokenizedCandidate([1, 2], [0, 2])
    # Trimmed offsets (a space left out) do not tile: ask the pieces instead.
    assert TokenizedCandidate.from_offsets("a bc", [1, 2], [(0, 1), (2, 4)]) is None


def test_pieces_that_do_not_add_up_give_no_starts() -> None:
    assert TokenizedCandidate.from_pieces("é", [1, 2], ["\ufffd", "\ufffd"]).starts is None


def test_draft_on_a_token_boundary_is_a_slice() -> None:
    tok = Greedy()
    text = '{"city": "Paris"}'
    calls: list[str] = []
    tokenized = TokenizedCandidates(tok.tokenize, lambda t: calls.append(t) or tok.encode(t))
    assert tok.decode(tokenized.draft(text, 10, 8)) == 'Paris"}'
    assert calls == []  # no encoding at a boundary


def test_draft_inside_a_token_encodes_only_the_rest_of_it() -> None:
    tok = Greedy()
    text = '{"city": "Paris"}'
    pieces: list[str] = []
    tokenized = TokenizedCandidates(tok.tokenize, lambda t: pieces.append(t) or tok.encode(t))
    assert tok.decode(tokenized.draft(text, 4, 16)) == 'ty": "Paris"}'
    assert pieces == ["ty"]
    assert tokenized.draft(text, 4, 2) == [VOCAB.index("ty"), VOCAB.index('":')]  # k counts all


@given(st.text(alphabet='{}": ,ciyPars', max_size=24), st.data())
def test_a_draft_is_the_rest_of_the_text(text: str, data: st.DataObject) -> None:
    tok = Greedy()
    position = data.draw(st.integers(0, len(text)))
    assert tok.decode(candidates_of(tok).draft(text, position, 64)) == text[position:]


def test_a_stop_ends_the_draft_before_the_token_across_it() -> None:
    """Candidate `{"city": "", ...}` with a stop at the value (offset 10): from the start
    the draft is `{"` `city` `":` ` "`; the token across the stop is left out, and a
    position at the stop drafts nothing."""
    tok = Greedy()
    text = '{"city": ""}'
    tokenized = candidates_of(tok)
    assert tok.decode(tokenized.draft(text, 0, 16, stop=10)) == '{"city": "'
    assert tok.decode(tokenized.draft(text, 0, 16, stop=9)) == '{"city":'  # ` "` crosses 9
    assert tokenized.draft(text, 10, 16, stop=10) == []
    assert tok.decode(tokenized.draft(text, 4, 16, stop=10)) == 'ty": "'  # inside `city`
    assert tokenized.draft(text, 8, 16, stop=9) == []  # inside the token across the stop


@given(st.text(alphabet='{}": ,ciyPars', max_size=24), st.data())
def test_a_stopped_draft_is_the_text_up_to_the_last_whole_token_before_the_stop(
    text: str, data: st.DataObject
) -> None:
    tok = Greedy()
    position = data.draw(st.integers(0, len(text)))
    stop = data.draw(st.integers(position, len(text)))
    drafted = tok.decode(candidates_of(tok).draft(text, position, 64, stop))
    assert text[position:stop].startswith(drafted)
    whole = candidates_of(tok).draft(text, position, 64)
    assert tok.decode(whole).startswith(drafted)


def test_advance_decodes_only_the_new_tokens() -> None:
    tok = Greedy()
    seen: list[list[int]] = []

    def decode(ids: Sequence[int]) -> str:
        seen.append(list(ids))
        return tok.decode(ids)

    output = tok.encode('{"city": "Paris"}')
    tracked = TrackedRequest()
    assert tracked.advance(output[:2], decode) == '{"city'
    assert tracked.advance(output[:5], decode) == '": "Paris'
    assert tracked.text == '{"city": "Paris'
    assert seen == [output[:2], output[2:5]]


def test_an_anchor_moves_along_without_searching(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[str] = []
    real = ra.best_position
    monkeypatch.setattr(ra, "best_position",
                        lambda text, c, realign: searches.append(text) or real(text, c, realign))
    candidates = ['{"city": "Rome"}', '{"city": "Paris"}']
    tracked = TrackedRequest()
    tracked.text = '{"'
    assert tracked.locate('{"', candidates, True) == (0, 2)
    for piece in ('city', '": "', 'Pa'):
        tracked.text += piece
        tracked.locate(piece, candidates, True)
    # Left candidate 0 at "Pa": one more search finds candidate 1, which it then follows.
    assert tracked.anchor == (1, 12)
    tracked.text += "ris"
    assert tracked.locate("ris", candidates, True) == (1, 15)
    assert searches == ['{"', '{"city": "Pa']


def test_new_candidates_search_again() -> None:
    tracked = TrackedRequest()
    tracked.text = '{"city": "Pa'
    first = ['{"city": "Rome"}']
    assert tracked.locate("Pa", first, True) is None
    more = ['{"city": "Paris"}', *first]  # the store replaces its list on arrival
    assert tracked.locate("", more, True) == (0, 12)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_incremental_text_matches_a_whole_decode(data: st.DataObject) -> None:
    """With the embedded tokenizer, multi-byte characters split across steps included."""
    backend = _embedded_backend()
    text = data.draw(st.text(alphabet='{}": aé€😀,1', min_size=1, max_size=20))
    ids = backend.encode(text, add_special_tokens=False).ids
    tracked = TrackedRequest()
    done = 0
    while done < len(ids):
        done = min(len(ids), done + data.draw(st.integers(1, 3)))
        tracked.advance(ids[:done], lambda i: backend.decode(list(i), skip_special_tokens=False))
        assert tracked.text == backend.decode(ids[:done], skip_special_tokens=False)


@cache
def _embedded_backend() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    return AutoTokenizer.from_pretrained(resolve_model_path("embedded")).backend_tokenizer
