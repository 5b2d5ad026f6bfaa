"""One request's place in its candidates, advanced step by step with the tokens it committed.

The proposer used to decode a row's whole output and re-encode the rest of the best candidate
on every engine step: linear in the output's length, with a tokenizer call per row per step.
Here each request keeps:

- the text it has written so far, extended by decoding only the tokens committed since the
  last step (a full decode only when a step ends inside a multi-byte character);
- an anchor `(candidate, position)`: where in which candidate the text stands. A step whose new
  text continues the candidate at the anchor just moves it; only a divergence (or new
  candidates) runs the text re-alignment of `alignment.best_position` again;
- nothing per candidate: each candidate text is tokenized once (`TokenizedCandidates`, shared
  by all requests, bounded) with the character offset where each token starts, so the draft
  from an anchor on a token boundary is a slice. An anchor inside a token (the model split the
  text differently) encodes only the piece up to the next boundary.

Worked example: candidate `{"city": "Paris"}` tokenized as `{"` `city` `":` ` "` `Paris` `"}`
(starts 0, 2, 6, 8, 10, 15). The model has written `{"city": "` in three steps; the anchor moved
0 → 2 → 8 → 10 without any search, and the draft is the slice from the token at 10: `Paris`
`"}`. Had it written `{"ci`, the anchor 4 is inside `city`: the piece `ty` is encoded and the
tokens from offset 6 follow.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from app.drafting.alignment import best_position
from app.drafting.draft_choice import PendingDraft, SourceRates
from app.drafting.draft_policy import RowAcceptance

Encode = Callable[[str], list[int]]
Decode = Callable[[Sequence[int] | np.ndarray], str]


@dataclass(frozen=True)
class TokenizedCandidate:
    ids: list[int]
    # Character offset where each token's text starts; None when the tokens do not split the
    # text into whole characters (a multi-byte character across tokens): then every draft is
    # encoded from the text.
    starts: list[int] | None

    @classmethod
    def from_pieces(cls, text: str, ids: list[int], pieces: Sequence[str]) -> TokenizedCandidate:
        """From each token's own text (`pieces`), when they add up to `text`."""
        if "".join(pieces) != text:
            return cls(ids, None)
        starts, offset = [], 0
        for piece in pieces:
            starts.append(offset)
            offset += len(piece)
        return cls(ids, starts)

    @classmethod
    def from_offsets(
        cls, text: str, ids: list[int], offsets: Sequence[tuple[int, int]]
    ) -> TokenizedCandidate | None:
        """From a fast tokenizer's character offsets, when they tile `text` exactly (they do
        not where a tokenizer trims spaces off its offsets: None, ask `from_pieces`)."""
        if not offsets or offsets[0][0] != 0 or offsets[-1][1] != len(text):
            return None
        starts = [start for start, _ in offsets]
        if starts[1:] != [end for _, end in offsets[:-1]]:
            return None
        return cls(ids, starts)


class TokenizedCandidates:
    """Candidate texts tokenized once, least recently used dropped past `capacity`.

    `warm` runs on the thread that hands candidates to the store (the replica's serving
    thread): the Rust tokenizer releases the GIL, so the engine's step thread finds the texts
    ready instead of tokenizing them between two steps. Schema placeholders repeat across
    requests with the same tools and are tokenized once for all of them."""

    def __init__(self, tokenize: Callable[[str], TokenizedCandidate], encode: Encode,
                 capacity: int = 4096) -> None:
        self._tokenize = tokenize
        self._encode = encode
        self._capacity = capacity
        self._lock = threading.Lock()
        self._texts: OrderedDict[str, TokenizedCandidate] = OrderedDict()
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()

    def warm(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.get(text)

    def get(self, text: str) -> TokenizedCandidate:
        with self._lock:
            found = self._texts.get(text)
            if found is not None:
                self._texts.move_to_end(text)
                return found
        found = self._tokenize(text)  # outside the lock: another thread may do it too
        with self._lock:
            self._remember(self._texts, text, found)
        return found

    def encode_piece(self, piece: str) -> list[int]:
        """A short piece of text (the rest of a token the model split otherwise), cached."""
        with self._lock:
            found = self._pieces.get(piece)
        if found is None:
            found = self._encode(piece)
            with self._lock:
                self._remember(self._pieces, piece, found)
        return found

    def draft(self, text: str, position: int, k: int, stop: int | None = None) -> list[int]:
        """Up to `k` tokens of `text` from character `position` on; with a `stop`, only the
        tokens that end at or before it (a token across it is the model's to write)."""
        tokenized = self.get(text)
        end = len(text) if stop is None else min(stop, len(text))
        if tokenized.starts is None:
            return self._encode(text[position:end])[:k] if end > position else []
        starts = tokenized.starts
        # Token i ends where token i+1 starts: those before `whole` end by `end`.
        whole = len(starts) if end == len(text) else bisect_right(starts, end, 1) - 1
        index = bisect_left(starts, position)
        if index < len(starts) and starts[index] == position:
            return tokenized.ids[index : min(index + k, whole)]
        boundary = starts[index] if index < len(starts) else len(text)
        if boundary > end:
            return []
        head = self.encode_piece(text[position:boundary])
        return (head + tokenized.ids[index : whole])[:k]

    def _remember(self, cache: OrderedDict, key: str, value: object) -> None:
        cache[key] = value
        if len(cache) > self._capacity:
            cache.popitem(last=False)


@dataclass
class TrackedRequest:
    """What the proposer remembers of one request between engine steps."""

    generated: int = 0  # output tokens already folded into `text`
    text: str = ""
    # The store's list the anchor refers to; the store replaces the list when candidates
    # arrive, so identity tells whether the anchor still refers to it.
    candidates: list[str] | None = None
    anchor: tuple[int, int] | None = None  # (candidate index, character position)
    acceptance: RowAcceptance = field(default_factory=RowAcceptance)
    # The draft of the last step, settled by the next step's committed tokens, and each
    # source's acceptance so far (app/drafting/draft_choice.py).
    pending: PendingDraft | None = None
    rates: SourceRates = field(default_factory=SourceRates)
    # While the sidecar's candidate is drafted: the other candidates (history, schemas) and
    # where the text stands in them, followed like `anchor` (the sidecar's gain is measured
    # against them). Reset on a step that does not follow them.
    others_of: list[str] | None = None
    others: list[str] = field(default_factory=list)
    others_anchor: tuple[int, int] | None = None

    def advance(self, output: Sequence[int] | np.ndarray, decode: Decode) -> str:
        """Fold the tokens committed since the last step into `text`; returns the new text."""
        if len(output) < self.generated:  # the engine restarted the request (preemption)
            self.generated, self.text, self.anchor = 0, "", None
        piece = decode(output[self.generated :]) if len(output) > self.generated else ""
        if "\ufffd" in piece:  # a character split across steps: decode it whole
            whole = decode(output)
            if whole.startswith(self.text):
                piece = whole[len(self.text) :]
            else:  # what was decoded before changed: the anchor no longer holds
                piece, self.anchor = "", None
            self.text = whole
        else:
            self.text += piece
        self.generated = len(output)
        return piece

    def locate(self, piece: str, candidates: list[str], realign: bool) -> tuple[int, int] | None:
        """The anchor after this step's `piece`: moved along when the text still follows the
        candidate there, searched again otherwise (or when candidates were added)."""
        if candidates is not self.candidates:
            self.candidates, self.anchor = candidates, None
        elif self.anchor is not None:
            index, position = self.anchor
            if candidates[index].startswith(piece, position):
                self.anchor = (index, position + len(piece))
                return self.anchor
        self.anchor = best_position(self.text, candidates, realign)
        return self.anchor

    def locate_others(
        self, piece: str, candidates: list[str], is_other: Callable[[str], bool], realign: bool
    ) -> tuple[str, int] | None:
        """(text, position) in the best of the `candidates` that pass `is_other`, followed
        like `locate` (call it every step, or reset `others_anchor`)."""
        if candidates is not self.others_of:
            self.others_of, self.others_anchor = candidates, None
            self.others = [c for c in candidates if is_other(c)]
        elif self.others_anchor is not None:
            index, position = self.others_anchor
            if self.others[index].startswith(piece, position):
                self.others_anchor = (index, position + len(piece))
                return self.others[index], position + len(piece)
        self.others_anchor = best_position(self.text, self.others, realign) \
            if self.others else None
        if self.others_anchor is None:
            return None
        return self.others[self.others_anchor[0]], self.others_anchor[1]
