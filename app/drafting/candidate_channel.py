"""The candidate store across processes: what a tensor-parallel engine's proposer reads.

With `tensor_parallel_size` > 1 vLLM runs the model runner, and so our proposer, in worker
processes (executor `mp`), away from the `CandidateStore` the replica fills. vLLM 0.32 takes
draft tokens from one worker only, the output rank (TP rank 0 of the last pipeline stage:
`MultiprocExecutor.take_draft_token_ids`, `unique_reply_rank=output_rank`); the scheduler then
sends them to every rank with the next step (`scheduled_spec_decode_tokens`), as it does for
its own proposers. So only that rank's proposer needs the candidates: it reads them here,
through a `RemoteStore`, from a `StoreServer` the replica runs on a Unix socket (authenticated,
local to the node, which `placement.py` guarantees); the other ranks' proposers stay unbound and
draft nothing, which vLLM discards anyway.

What crosses, once per engine step and in one exchange for all rows: the proposer names the
requests it will read (`RemoteStore.begin_step`), each with the version of the copy it holds;
the server answers with a snapshot of each request whose entry moved since (enabled flag,
candidate texts with their sources and value stops, `realign`, and the auto-mode gate's state:
`auto_drafts.GateState`) and the requests that are gone. An unchanged request keeps its copy,
the same objects as before, so the proposer's alignment keeps its place in the candidates; a
changed gate is restored into the same copy, whose candidate lists are rebuilt only when its
version moved. The proposer's accounting (drafted, paused, settled) is buffered over the step
and sent at its end without waiting for an answer (`RemoteStore.end_step`); the server applies it
before it reads the next step's request, the connection keeping their order.

What does not cross: the tenant's suffix index (`RequestSpeculation.suffix`), a live and growing
object of the replica: a tensor-parallel engine drafts from the candidates (sidecar, history,
schemas, in every `tool_choice` mode) and prompt lookup, not from the `suffix` source.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Literal

from app.drafting.auto_drafts import AutoDrafts, GateState
from app.drafting.candidate_store import CandidateStore, ProposerStore, RequestSpeculation
from app.speculation.draft_sources import DraftSource, SourceTally

Version = tuple[int, int]  # (the entry's, its gate's or -1)


@dataclass(frozen=True)
class Snapshot:
    """One request's entry as plain data, as the output rank's proposer reads it."""

    version: Version
    enabled: bool
    candidates: tuple[str, ...]
    candidate_sources: tuple[tuple[str, DraftSource], ...]
    candidate_stops: tuple[tuple[str, tuple[int, ...]], ...]
    realign: bool
    sized: bool
    gate: GateState | None


def version_of(entry: RequestSpeculation) -> Version:
    return (entry.version, entry.gate.version if entry.gate is not None else -1)


def snapshot(entry: RequestSpeculation) -> Snapshot:
    return Snapshot(version_of(entry), entry.enabled, tuple(entry.candidates),
                    tuple(entry.candidate_sources.items()),
                    tuple(entry.candidate_stops.items()), entry.realign, entry.sized,
                    entry.gate.state() if entry.gate is not None else None)


def changed(store: CandidateStore, known: list[tuple[str, Version | None]]
            ) -> list[tuple[str, Snapshot | None]]:
    """The requests of `known` whose entry is not at the version the reader holds: a snapshot
    of each, or None where the request is gone (and the reader held it)."""
    answer: list[tuple[str, Snapshot | None]] = []
    for request_id, held in known:
        current = store.read(request_id, partial(_if_moved, held))
        if current is None:
            if held is not None:
                answer.append((request_id, None))
        elif isinstance(current, Snapshot):
            answer.append((request_id, current))
    return answer


_SAME = "same"


def _if_moved(held: Version | None, entry: RequestSpeculation) -> Snapshot | str:
    return _SAME if version_of(entry) == held else snapshot(entry)


class StoreServer:
    """Serves one `CandidateStore` to the engine's worker processes (daemon threads)."""

    def __init__(self, store: CandidateStore) -> None:
        self.store = store
        self.authkey = os.urandom(32)
        self._dir = tempfile.mkdtemp(prefix="ooo-spec-store-")
        self.address = os.path.join(self._dir, "store.sock")
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = threading.Event()
        # Fetches answered (one per engine step of the output rank), and record batches taken.
        self.exchanges = 0
        self.record_batches = 0
        self._thread = threading.Thread(target=self._accept, name="candidate-store-server",
                                        daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):  # closed, or a failed handshake
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True,
                             name="candidate-store-client").start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            while True:
                try:
                    kind, payload = connection.recv()
                except (EOFError, OSError):
                    return
                if kind == "fetch":
                    self.exchanges += 1
                    connection.send(changed(self.store, payload))
                elif kind == "records":  # one-way: nothing is sent back
                    self.record_batches += 1
                    self._record(payload)
                else:
                    raise ValueError(f"unknown candidate store message {kind!r}")

    def _record(self, records: list[Record]) -> None:
        for kind, request_id, args in records:
            if kind == "draft":
                self.store.record_draft(request_id, *args)
            elif kind == "pause":
                self.store.record_pause(request_id)
            elif kind == "settled":
                self.store.record_settled(request_id, *args)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()  # also removes the socket file
        shutil.rmtree(self._dir, ignore_errors=True)


# (what, request id, its arguments): the proposer's accounting, applied in order.
Record = tuple[Literal["draft", "pause", "settled"], str, tuple[Any, ...]]


class RemoteStore:
    """The store as the output rank's proposer sees it (`ProposerStore`): copies of the entries
    it reads, refreshed once per step by one exchange with a `StoreServer` in another
    process."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self._connection = Client(address, family="AF_UNIX", authkey=authkey)
        self._lock = threading.Lock()
        # Set by CandidateProposer.bind; candidates are tokenized on first use here instead.
        self.prepare: Callable[[list[str]], None] | None = None
        # The copies, with the version each was taken at; only those asked for last step.
        self._copies: dict[str, tuple[Version, RequestSpeculation]] = {}
        self._gone: set[str] = set()
        self._records: list[Record] = []

    def _fetch(self, known: list[tuple[str, Version | None]]
               ) -> list[tuple[str, Snapshot | None]]:
        with self._lock:
            self._connection.send(("fetch", known))
            answer: list[tuple[str, Snapshot | None]] = self._connection.recv()
            return answer

    def begin_step(self, request_ids: Iterable[str]) -> None:
        """Refresh the copies of `request_ids` (one exchange); the others are dropped."""
        ids = list(request_ids)
        held = self._copies
        self._copies = {r: held[r] for r in ids if r in held}
        self._gone = set()
        if not ids:
            return
        for request_id, found in self._fetch(
                [(r, held[r][0] if r in held else None) for r in ids]):
            if found is None:
                self._copies.pop(request_id, None)
            else:
                copy = self._copies.get(request_id)
                self._copies[request_id] = (found.version,
                                            _apply(found, copy[1] if copy else None))
        self._gone = {r for r in ids if r not in self._copies}

    def get(self, request_id: str) -> RequestSpeculation | None:
        if request_id not in self._copies and request_id not in self._gone:
            self.begin_step([*self._copies, request_id])  # outside a step: fetch it now
        copy = self._copies.get(request_id)
        return None if copy is None else copy[1]

    def record_draft(self, request_id: str, drafted: int, source: DraftSource = "sidecar") -> None:
        self._records.append(("draft", request_id, (drafted, source)))

    def record_pause(self, request_id: str) -> None:
        self._records.append(("pause", request_id, ()))

    def record_settled(self, request_id: str, source: DraftSource, earned: SourceTally) -> None:
        self._records.append(("settled", request_id, (source, earned)))

    def end_step(self) -> None:
        """Send the step's accounting, without waiting for an answer."""
        if not self._records:
            return
        records, self._records = self._records, []
        with self._lock:
            self._connection.send(("records", records))

    def close(self) -> None:
        self.end_step()
        self._connection.close()


def _apply(found: Snapshot, copy: RequestSpeculation | None) -> RequestSpeculation:
    """The copy of an entry after `found`: new candidate lists only where they changed, the
    gate's copy restored in place."""
    candidates = list(found.candidates)
    gate = copy.gate if copy is not None else None
    if found.gate is None:
        gate = None
    elif gate is None:
        gate = AutoDrafts.from_state(found.gate)
    else:
        gate.restore(found.gate)
    if copy is not None and copy.candidates == candidates:
        candidates = copy.candidates  # the alignment's anchor refers to this list
    return RequestSpeculation(enabled=found.enabled, candidates=candidates,
                              candidate_sources=dict(found.candidate_sources),
                              candidate_stops=dict(found.candidate_stops),
                              realign=found.realign, sized=found.sized, gate=gate)


def is_output_rank(worker: Any) -> bool:
    """The rank whose drafts vLLM keeps: TP rank 0 of the last pipeline stage
    (`MultiprocExecutor._get_output_rank`)."""
    parallel = worker.parallel_config
    world = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
    return int(worker.rank) == world - parallel.tensor_parallel_size


def bind_remote_proposer(
    worker: Any,
    address: str,
    authkey: bytes,
    tokenizer: Any,
    prompt_lookup_fallback: bool,
    lookup_min: int,
    lookup_max: int,
    policy: Any = None,
) -> bool:
    """Run on every worker via `collective_rpc`: the output rank's proposer reads the replica's
    store through the socket; the others stay unbound (their drafts are never used). True when
    the worker did what its rank needs."""
    from app.drafting.candidate_proposer import CandidateProposer

    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, CandidateProposer):
        return False
    if not is_output_rank(worker):
        return True
    store: ProposerStore = RemoteStore(address, authkey)
    drafter.bind(store, runner, tokenizer, prompt_lookup_fallback, lookup_min, lookup_max,
                 policy)
    return True
