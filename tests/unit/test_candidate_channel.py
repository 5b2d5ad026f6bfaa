"""The candidate store across processes (app/drafting/candidate_channel.py), as a
tensor-parallel engine uses it: the replica's store served on a socket, the proposer of the
output rank in another process (spawned, as vLLM's `mp` executor spawns its workers) driven by
a fake runner, the other rank's proposer unbound. Its drafts must be those an in-process
proposer gives for the same candidates, and its accounting must reach the replica's store."""

from __future__ import annotations

import multiprocessing
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.drafting.candidate_channel import (
    RemoteStore,
    StoreServer,
    bind_remote_proposer,
    is_output_rank,
)
from app.drafting.candidate_proposer import CandidateProposer
from app.drafting.candidate_store import CandidateStore
from tests.unit.test_candidate_proposer import CALL, PROMPT, encode, tokenizer

K = 8


def fake_worker(rank: int, tp: int = 2) -> Any:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                             model_config=SimpleNamespace(max_model_len=512))
    runner = SimpleNamespace(
        drafter=CandidateProposer(config),
        input_batch=SimpleNamespace(req_ids=["r0"], num_prompt_tokens=np.array([PROMPT])))
    parallel = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1)
    return SimpleNamespace(rank=rank, parallel_config=parallel, model_runner=runner)


def drafts_after(proposer: CandidateProposer, output: list[int], written: int) -> list[int]:
    """The draft after the runner committed `written` tokens of `output` in one step."""
    tokens = np.zeros((1, 512), dtype=np.int32)
    tokens[0, PROMPT: PROMPT + written] = output[:written]
    return proposer.propose([output[:written]], np.array([PROMPT + written]), tokens)[0]


def worker_process(address: str, authkey: bytes, rank: int, written: int,
                   results: Any) -> None:
    """A spawned worker: binds like `collective_rpc(bind_remote_proposer)` and proposes."""
    worker = fake_worker(rank)
    bound = bind_remote_proposer(worker, address, authkey, tokenizer(), False, 2, 4)
    drafts = drafts_after(worker.model_runner.drafter, encode(CALL), written)
    results.put((bound, drafts))


def test_the_output_rank_is_tp_rank_0_of_the_last_stage() -> None:
    assert is_output_rank(fake_worker(0)) and not is_output_rank(fake_worker(1))
    last_stage = SimpleNamespace(rank=4, parallel_config=SimpleNamespace(
        tensor_parallel_size=4, pipeline_parallel_size=2))
    assert is_output_rank(last_stage)


def test_a_remote_store_reads_and_records_like_the_store() -> None:
    store = CandidateStore()
    server = StoreServer(store)
    try:
        store.open("r0", enabled=True, realign=False)
        store.add_candidates("r0", [CALL], source="history")
        remote = RemoteStore(server.address, server.authkey)
        entry = remote.get("r0")
        assert entry is not None and entry.enabled and not entry.realign
        assert entry.candidates == [CALL] and entry.source_of(CALL) == "history"
        assert remote.get("gone") is None
        remote.record_draft("r0", 5, "history")
        remote.record_pause("r0")
        local = store.get("r0")
        assert local is not None
        assert local.drafted_tokens == 5 and local.paused_steps == 1
        assert local.sources.of("history").drafted_tokens == 5
        remote.close()
    finally:
        server.close()
    assert not os.path.exists(os.path.dirname(server.address)), "the socket's folder is left"


def test_a_wrong_key_is_refused() -> None:
    server = StoreServer(CandidateStore())
    try:
        with pytest.raises(Exception):  # noqa: B017 (multiprocessing's AuthenticationError)
            RemoteStore(server.address, b"not the key")
        assert RemoteStore(server.address, server.authkey).get("r0") is None  # still serving
    finally:
        server.close()


def test_the_output_ranks_proposer_in_another_process_drafts_the_replicas_candidates() -> None:
    output = encode(CALL)
    written = 5
    worker = fake_worker(0)
    local = worker.model_runner.drafter
    in_process = CandidateStore()
    local.bind(in_process, worker.model_runner, tokenizer(), False, 2, 4)
    in_process.open("r0", enabled=True)
    in_process.add_candidates("r0", [CALL])
    expected = drafts_after(local, output, written)
    assert expected == output[written: written + K]

    store = CandidateStore()
    server = StoreServer(store)
    try:
        store.open("r0", enabled=True)
        store.add_candidates("r0", [CALL])
        spawn = multiprocessing.get_context("spawn")
        results = spawn.Queue()
        ranks = [spawn.Process(target=worker_process,
                               args=(server.address, server.authkey, rank, written, results))
                 for rank in (0, 1)]
        for process in ranks:
            process.start()
        got = sorted([results.get(timeout=120) for _ in ranks], key=lambda r: -len(r[1]))
        for process in ranks:
            process.join(timeout=60)
            assert process.exitcode == 0
        (bound0, drafts0), (bound1, drafts1) = got
        assert bound0 and bound1
        assert drafts0 == expected, "the output rank drafts what an in-process proposer does"
        assert drafts1 == [], "the other rank stays unbound: vLLM keeps the output rank's drafts"
        entry = store.get("r0")
        assert entry is not None and entry.drafted_tokens == len(expected)
    finally:
        server.close()
