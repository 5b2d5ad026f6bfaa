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

What crosses: each request's enabled flag, candidate texts and their sources, `realign`; the
proposer's accounting (drafted, paused, settled) goes back. What does not: the auto-mode gate
(`RequestSpeculation.gate`) and the tenant's suffix index, live objects of the replica; a
tensor-parallel engine drafts from the candidates and prompt lookup only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from app.drafting.candidate_store import CandidateStore, RequestSpeculation
from app.speculation.draft_sources import DraftSource, SourceTally

# (enabled, candidates, candidate_sources, realign)
Snapshot = tuple[bool, list[str], dict[str, DraftSource], bool]


def snapshot(entry: RequestSpeculation | None) -> Snapshot | None:
    if entry is None:
        return None
    return (entry.enabled, list(entry.candidates), dict(entry.candidate_sources), entry.realign)


class StoreServer:
    """Serves one `CandidateStore` to the engine's worker processes (daemon threads)."""

    def __init__(self, store: CandidateStore) -> None:
        self.store = store
        self.authkey = os.urandom(32)
        self._dir = tempfile.mkdtemp(prefix="ooo-spec-store-")
        self.address = os.path.join(self._dir, "store.sock")
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = threading.Event()
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
                    message = connection.recv()
                except (EOFError, OSError):
                    return
                connection.send(self._handle(message))

    def _handle(self, message: tuple[Any, ...]) -> Any:
        kind, request_id, *rest = message
        if kind == "get":
            return snapshot(self.store.get(request_id))
        if kind == "record_draft":
            self.store.record_draft(request_id, *rest)
        elif kind == "record_pause":
            self.store.record_pause(request_id)
        elif kind == "record_settled":
            self.store.record_settled(request_id, *rest)
        else:
            raise ValueError(f"unknown candidate store message {kind!r}")
        return None

    def close(self) -> None:
        self._closed.set()
        self._listener.close()  # also removes the socket file
        shutil.rmtree(self._dir, ignore_errors=True)


class RemoteStore:
    """What the proposer calls on its store, answered by a `StoreServer` in another process."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self._connection = Client(address, family="AF_UNIX", authkey=authkey)
        self._lock = threading.Lock()
        # Set by CandidateProposer.bind; candidates are tokenized on first use here instead.
        self.prepare: Callable[[list[str]], None] | None = None

    def _call(self, *message: Any) -> Any:
        with self._lock:
            self._connection.send(message)
            return self._connection.recv()

    def get(self, request_id: str) -> RequestSpeculation | None:
        found: Snapshot | None = self._call("get", request_id)
        if found is None:
            return None
        enabled, candidates, sources, realign = found
        return RequestSpeculation(enabled=enabled, candidates=candidates,
                                  candidate_sources=sources, realign=realign)

    def record_draft(self, request_id: str, drafted: int, source: DraftSource = "sidecar") -> None:
        self._call("record_draft", request_id, drafted, source)

    def record_pause(self, request_id: str) -> None:
        self._call("record_pause", request_id)

    def record_settled(self, request_id: str, source: DraftSource, earned: SourceTally) -> None:
        self._call("record_settled", request_id, source, earned)

    def close(self) -> None:
        self._connection.close()


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
    store: Any = RemoteStore(address, authkey)
    drafter.bind(store, runner, tokenizer, prompt_lookup_fallback, lookup_min, lookup_max,
                 policy)
    return True
