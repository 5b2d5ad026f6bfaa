"""`tool_choice: auto`: which candidate texts a request drafts from, as its output grows.

In auto mode the main model chooses between a text answer and a call, so the drafts follow
the output instead of assuming a call:

- **thinking**: a thinking model's reasoning has not closed yet (`</think>`): no drafts;
- **open**: the content written so far (after leading whitespace) is the start of a predicted
  call (the sidecar's or history's, rendered in the format's call syntax, e.g. hermes'
  `<tool_call>\\n{...}\\n</tool_call>`): drafts from the predicted calls, from the first token
  on. A sidecar that predicts no call (`no_call`) leaves this phase empty;
- **diverged**: the content has left every predicted call before any call marker (a text
  answer, or no prediction yet): no drafts. Text never becomes a prefix of a call again, so a
  text answer drafts at most once or twice and is never held up;
- **call**: the output has opened a call (the format's `call_start`): the predicted calls and
  the schema drafts (keys and punctuation of every offered tool, rendered in the format), all
  anchored at the marker, exactly as a forced call drafts from its first token.

The proposer asks `AutoDrafts.candidates` on the engine's step thread with the text committed
so far, so a phase change takes effect at the very next draft; the serving thread only hands
predictions in. Candidate lists are rebuilt only when the phase, its anchor or the predictions
change: the proposer keeps its place in a list while the list stays the same object.

A tensor-parallel engine's proposer runs in another process: there a copy of the gate follows
the replica's through `GateState` (plain data: the format's name, the reasoning parser, the
schema drafts, the predictions and their sources; `version` changes with any of them), which
`app/drafting/candidate_channel.py` sends only when the version moved.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.formats.reasoning import Reasoning
from app.formats.tool_format import SchemaDraft
from app.formats.tool_formats import get_format
from app.formats.tool_formats.base import ToolFormat
from app.speculation.draft_sources import DraftSource

PhaseKind = Literal["thinking", "open", "diverged", "call"]


@dataclass(frozen=True)
class GateState:
    """An `AutoDrafts`' inputs as plain (picklable) data."""

    format: str
    reasoning: Reasoning | None
    schema: tuple[SchemaDraft, ...]
    predicted: tuple[str, ...]
    sources: tuple[tuple[str, DraftSource], ...]
    no_call: bool
    version: int


@dataclass(frozen=True)
class Phase:
    kind: PhaseKind
    # Index in the output text where the candidates start (the content's first non-blank
    # character in `open`, the call marker in `call`).
    anchor: int = 0


def phase(
    text: str, fmt: ToolFormat, reasoning: Reasoning | None, predicted: Sequence[str]
) -> Phase:
    """Where an auto-mode output stands, from its text so far.

    >>> from app.formats.tool_formats import get_format
    >>> call = '<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>'
    >>> phase("<tool", get_format("hermes"), None, [call])
    Phase(kind='open', anchor=0)
    >>> phase("Hello", get_format("hermes"), None, [call])
    Phase(kind='diverged', anchor=0)
    >>> phase("Sure.\\n<tool_call>", get_format("hermes"), None, [])
    Phase(kind='call', anchor=6)
    """
    start = 0
    if reasoning is not None:
        end = reasoning.ended_at(text)
        if end is None:
            return Phase("thinking")
        start = end
    content = text[start:]
    marker = fmt.call_start(content)
    if marker >= 0:
        return Phase("call", start + marker)
    body = content.lstrip()
    anchor = start + len(content) - len(body)
    if any(c.startswith(body) for c in predicted):
        return Phase("open", anchor)
    return Phase("diverged", anchor)


class AutoDrafts:
    """One auto-mode request's drafting state: predictions in (serving thread), candidate
    texts out (engine step thread)."""

    def __init__(self, fmt: ToolFormat, reasoning: Reasoning | None,
                 schema: Sequence[SchemaDraft]) -> None:
        self.format = fmt
        # Only a thinking request waits for its reasoning to close.
        self.reasoning = reasoning if reasoning is not None and reasoning.thinking else None
        self._lock = threading.Lock()
        self._schema = list(schema)
        self._predicted: list[str] = []
        self._no_call = False
        self._version = 0
        self._cached: tuple[tuple[PhaseKind, int, int], list[str]] | None = None
        # Source of each predicted text, and of each built candidate (drafts are counted per
        # source); schema texts are the schema's.
        self._sources: dict[str, DraftSource] = {}
        self._built_sources: dict[str, DraftSource] = {}
        self._built_stops: dict[str, tuple[int, ...]] = {}

    @property
    def schema(self) -> list[SchemaDraft]:
        return self._schema

    @schema.setter
    def schema(self, drafts: Sequence[SchemaDraft]) -> None:
        """The schema drafts (set once the request's tools are rendered)."""
        with self._lock:
            self._schema = list(drafts)
            self._version += 1

    @property
    def version(self) -> int:
        """Moves whenever the predictions, `no_call` or the schema drafts change."""
        with self._lock:
            return self._version

    def state(self) -> GateState:
        with self._lock:
            return GateState(self.format.name, self.reasoning, tuple(self._schema),
                             tuple(self._predicted), tuple(self._sources.items()),
                             self._no_call, self._version)

    @classmethod
    def from_state(cls, state: GateState) -> AutoDrafts:
        """A copy of the gate whose `state()` this is (in another process)."""
        gate = cls(get_format(state.format), state.reasoning, list(state.schema))
        gate.restore(state)
        return gate

    def restore(self, state: GateState) -> None:
        """Take the inputs of `state` (a newer state of the gate this copies). The candidate
        lists built so far stay valid while `state.version` is the one they were built at."""
        with self._lock:
            self._schema = list(state.schema)
            self._predicted = list(state.predicted)
            self._sources = dict(state.sources)
            self._no_call = state.no_call
            self._version = state.version

    def predicted(self, texts: list[str], source: DraftSource = "sidecar") -> None:
        """Rendered predicted calls (the sidecar's, history's); newer ones first, as the store
        orders them (they win ties)."""
        if not texts:
            return
        with self._lock:
            self._predicted = list(dict.fromkeys([*texts, *self._predicted]))
            for text in texts:
                self._sources.setdefault(text, source)
            self._version += 1

    def source_of(self, candidate: str) -> DraftSource:
        """The source of a candidate text `candidates` returned."""
        with self._lock:
            return self._built_sources.get(candidate, "sidecar")

    def stops_of(self, candidate: str) -> tuple[int, ...]:
        """Where a draft from a candidate text `candidates` returned stops (a schema draft's
        values)."""
        with self._lock:
            return self._built_stops.get(candidate, ())

    def no_call(self) -> None:
        """The sidecar expects a text answer: nothing is drafted before a call opens."""
        with self._lock:
            self._no_call = True
            self._version += 1

    def candidates(self, text: str) -> list[str]:
        """The candidate texts (whole outputs) the output `text` drafts from now; the same list
        object as the previous call while nothing changed."""
        with self._lock:
            predicted = self._predicted
            opening = [] if self._no_call else predicted
            version = self._version
            cached = self._cached
            schema = self._schema
        now = phase(text, self.format, self.reasoning, opening)
        if now.kind in ("thinking", "diverged"):
            return []
        key = (now.kind, now.anchor, version)
        if cached is not None and cached[0] == key:
            return cached[1]
        prefix = text[: now.anchor]
        texts = opening if now.kind == "open" else [*predicted, *(d.text for d in schema)]
        built = [prefix + t for t in dict.fromkeys(texts)]
        moved = [] if now.kind == "open" else [d.behind(prefix) for d in schema if d.stops]
        stops = {d.text: d.stops for d in moved}
        with self._lock:
            self._cached = (key, built)
            self._built_sources = {prefix + t: self._sources.get(t, "schema")
                                   for t in dict.fromkeys(texts)}
            self._built_stops = stops
        return built
