"""`CandidateFeed`: drafts known at the start go to the store behind the thoughts, schema
drafts with their value stops moved along with the text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.formats.tool_format import SchemaDraft
from app.main_model.service import CandidateFeed
from app.speculation.draft_sources import DraftSource


@dataclass
class Recorded:
    added: list[tuple[list[str], DraftSource, dict[str, tuple[int, ...]]]] = field(
        default_factory=list)

    def add_candidates(self, request_id: str, candidates: list[str],
                       source: DraftSource = "sidecar",
                       stops: Mapping[str, tuple[int, ...]] | None = None) -> bool:
        self.added.append((candidates, source, dict(stops or {})))
        return True

    def set_gate(self, request_id: str, gate: Any) -> bool:
        return True

    def set_suffix(self, request_id: str, index: Any) -> bool:
        return True


SCHEMA = SchemaDraft('{"city": ""}', (10,))


def test_a_schema_draft_keeps_its_stops() -> None:
    store = Recorded()
    feed = CandidateFeed(store, thinking=False, status="none")
    feed.add(['{"city": "Rome"}'], "history")
    feed.add_schema([SCHEMA])
    feed.on_start("r0")
    assert store.added == [([SCHEMA.text], "schema", {SCHEMA.text: (10,)}),
                           (['{"city": "Rome"}'], "history", {})]


def test_behind_the_thoughts_the_stops_move_with_the_text() -> None:
    store = Recorded()
    feed = CandidateFeed(store, thinking=True, status="none")
    feed.add_schema([SCHEMA])
    feed.on_start("r0")
    assert store.added == []  # the thoughts have not closed
    thoughts = "<think>x</think>"
    feed.reasoning_ended(thoughts)
    [(texts, source, stops)] = store.added
    assert source == "schema"
    assert texts == [thoughts + SCHEMA.text, thoughts + "\n\n" + SCHEMA.text]
    for text in texts:
        [stop] = stops[text]
        assert text[:stop].endswith('{"city": "') and text[stop:] == '"}'
