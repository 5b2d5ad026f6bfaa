"""Per-request candidate store shared by the serving thread and the engine's proposer.

Writers: the main-model deployment (when a sidecar/history prediction arrives). Reader: the
custom proposer, called from the engine step thread. Everything is keyed by the engine's
internal request id, which is also what the model runner's batch rows carry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from app.drafting.auto_drafts import AutoDrafts
from app.drafting.suffix_index import SuffixIndex
from app.speculation.draft_sources import DraftSource, SourceTallies, SourceTally

T = TypeVar("T")


@dataclass
class RequestSpeculation:
    enabled: bool
    # Texts of the whole expected output, rendered in the main model's format (one entry per
    # candidate and whitespace style).
    candidates: list[str] = field(default_factory=list)
    drafted_tokens: int = 0
    # Load-aware drafting (draft_policy.py): steps this request sat out, and tokens drafted
    # after its first pause (drafting switched off and on again).
    paused_steps: int = 0
    drafted_after_pause: int = 0
    # Off only to measure what re-alignment after a divergence is worth (benchmarks).
    realign: bool = True
    # Off only to measure what sizing drafts by their worth is worth (benchmarks): this
    # request's drafts run to the budget (app/drafting/draft_worth.py).
    sized: bool = True
    # `tool_choice: auto`: the candidates follow the output (app/drafting/auto_drafts.py)
    # instead of `candidates`.
    gate: AutoDrafts | None = None
    # Which source each candidate text came from (drafts are counted per source).
    candidate_sources: dict[str, DraftSource] = field(default_factory=dict)
    # Where a schema draft's values begin (app/formats/tool_format.py `value_stops`): a draft
    # from the text stops there.
    candidate_stops: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # The tenant's earlier outputs (app/drafting/suffix_index.py); None: no suffix drafts.
    suffix: SuffixIndex | None = None
    sources: SourceTallies = field(default_factory=SourceTallies)
    # Moves whenever the candidates, their sources, the gate or the suffix index are replaced
    # (what a copy in another process must fetch again; app/drafting/candidate_channel.py).
    version: int = 0

    def source_of(self, candidate: str) -> DraftSource:
        if self.gate is not None:
            return self.gate.source_of(candidate)
        return self.candidate_sources.get(candidate, "sidecar")

    def stops_of(self, candidate: str) -> tuple[int, ...]:
        """The offsets in `candidate` where a draft from it stops (its unknown values)."""
        if self.gate is not None:
            return self.gate.stops_of(candidate)
        return self.candidate_stops.get(candidate, ())


class ProposerStore(Protocol):
    """What the proposer reads and records: the `CandidateStore` in its process, or its copy
    across processes (`candidate_channel.RemoteStore`). Each engine step the proposer calls
    `begin_step` with every request it will ask about, then `get` and the `record_*` methods,
    then `end_step`."""

    prepare: Callable[[list[str]], None] | None

    def begin_step(self, request_ids: Iterable[str]) -> None: ...

    def get(self, request_id: str) -> RequestSpeculation | None: ...

    def record_draft(
        self, request_id: str, drafted: int, source: DraftSource = "sidecar"
    ) -> None: ...

    def record_pause(self, request_id: str) -> None: ...

    def record_settled(self, request_id: str, source: DraftSource, earned: SourceTally) -> None: ...

    def end_step(self) -> None: ...


class CandidateStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, RequestSpeculation] = {}
        # Set by the proposer when it binds: readies candidate texts for drafting on the
        # thread that adds them, not on the engine's step thread.
        self.prepare: Callable[[list[str]], None] | None = None

    def open(self, request_id: str, enabled: bool, realign: bool = True,
             sized: bool = True) -> None:
        with self._lock:
            self._requests[request_id] = RequestSpeculation(enabled=enabled, realign=realign,
                                                            sized=sized)

    def add_candidates(
        self, request_id: str, candidates: list[str], source: DraftSource = "sidecar",
        stops: Mapping[str, tuple[int, ...]] | None = None,
    ) -> bool:
        """Attach `source`'s candidates (`stops`: where a draft from a text stops); False when
        the request is already gone (finished/aborted)."""
        if self.prepare is not None:
            self.prepare(candidates)
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is None:
                return False
            # Newer predictions (sidecar over history) go first: they win ties.
            entry.candidates = list(candidates) + entry.candidates
            for text in candidates:
                entry.candidate_sources.setdefault(text, source)
            for text, at in (stops or {}).items():
                if at:
                    entry.candidate_stops.setdefault(text, at)
            entry.version += 1
            return True

    def set_suffix(self, request_id: str, index: SuffixIndex) -> bool:
        """Draft from `index` (the request's tenant's) too; False when the request is gone."""
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is None:
                return False
            entry.suffix = index
            entry.version += 1
            return True

    def set_gate(self, request_id: str, gate: AutoDrafts) -> bool:
        """Let `gate` choose the request's candidates step by step (auto mode); False when the
        request is already gone."""
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is None:
                return False
            entry.gate = gate
            entry.version += 1
            return True

    def get(self, request_id: str) -> RequestSpeculation | None:
        with self._lock:
            return self._requests.get(request_id)

    def read(self, request_id: str, reader: Callable[[RequestSpeculation], T]) -> T | None:
        """`reader(entry)` under the store's lock (no writer changes the entry meanwhile);
        None when the request is gone."""
        with self._lock:
            entry = self._requests.get(request_id)
            return None if entry is None else reader(entry)

    def begin_step(self, request_ids: Iterable[str]) -> None:
        """Nothing to fetch: the proposer reads this store directly."""

    def end_step(self) -> None:
        """Nothing to send: the records went in as they were made."""

    def record_draft(self, request_id: str, drafted: int, source: DraftSource = "sidecar") -> None:
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is not None:
                entry.drafted_tokens += drafted
                entry.sources.of(source).drafted_tokens += drafted
                if entry.paused_steps:
                    entry.drafted_after_pause += drafted

    def record_settled(self, request_id: str, source: DraftSource, earned: SourceTally) -> None:
        """What `source`'s last draft for the request got accepted (draft_choice.settle)."""
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is not None:
                entry.sources.of(source).add(earned)

    def record_pause(self, request_id: str) -> None:
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is not None:
                entry.paused_steps += 1

    def close(self, request_id: str) -> RequestSpeculation | None:
        with self._lock:
            return self._requests.pop(request_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._requests)
