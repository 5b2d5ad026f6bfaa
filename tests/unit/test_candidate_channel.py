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

from app.drafting.auto_drafts import AutoDrafts
from app.drafting.candidate_channel import (
    RemoteStore,
    StoreServer,
    bind_remote_proposer,
    is_output_rank,
)
from app.drafting.candidate_proposer import CandidateProposer
from app.drafting.candidate_store import CandidateStore
from app.formats.tool_format import SchemaDraft, value_stops
from app.formats.tool_formats import ParsedCall, get_format
from tests.unit.test_candidate_proposer import CALL, PROMPT, Batch, decode, encode, tokenizer

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
        assert store.get("r0").drafted_tokens == 0, "records wait for the end of the step"
        remote.end_step()  # sent without an answer; the next fetch is served after them
        remote.begin_step(["r0"])
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


def test_the_other_ranks_stay_unbound() -> None:
    """vLLM keeps the output rank's drafts only: the others read nothing and draft nothing."""
    server = StoreServer(CandidateStore())
    try:
        worker = fake_worker(1)
        assert bind_remote_proposer(worker, server.address, server.authkey, tokenizer(),
                                    False, 2, 4)
        assert worker.model_runner.drafter.store is None
        assert drafts_after(worker.model_runner.drafter, encode(CALL), 5) == []
        assert server.exchanges == 0
    finally:
        server.close()


# ----- tool_choice: auto across processes ---------------------------------------------------
HERMES = get_format("hermes")
WEATHER_CALL = HERMES.render([ParsedCall("get_weather", {"city": "Paris"})])
TIME_CALL = HERMES.render([ParsedCall("get_time", {"zone": "Europe/Lisbon"})])
# With their value stops, which cross to the output rank with the gate.
SCHEMA = [SchemaDraft(HERMES.render([ParsedCall(name, {key: ""})]),
                      value_stops(HERMES.render([ParsedCall(name, {key: ""})]),
                                  HERMES.render([ParsedCall(name, {key: "x"})])))
          for name, key in (("get_weather", "city"), ("get_time", "zone"))]
# r0 calls what the sidecar predicts, which arrives after PREDICTED_AT steps (the call has
# opened by then); r1 answers a little text, then calls a tool nobody predicted: schema drafts;
# r2 is a forced call (no gate) drafted from its candidate, r3 one drafted from its tool's
# schema, up to the value (its stop crosses with the candidates).
AUTO_OUTPUTS = [WEATHER_CALL, "Let me look.\n" + TIME_CALL, CALL, TIME_CALL]
PREDICTED_AT = 3


def fill(store: CandidateStore, gates: list[AutoDrafts]) -> None:
    """The replica's side: r0 and r1 in auto mode (their gates), r2 forced."""
    r0, r1, r2, r3 = (f"r{i}" for i in range(len(AUTO_OUTPUTS)))
    for request_id in (r0, r1, r2, r3):
        if store.get(request_id) is None:
            store.open(request_id, enabled=True)
    assert store.set_gate(r0, gates[0]) and store.set_gate(r1, gates[1])
    assert store.add_candidates(r2, [CALL], source="history")
    schema = SCHEMA[1]
    assert store.add_candidates(r3, [schema.text], "schema", {schema.text: schema.stops})


def run_auto(batch: Batch, predict: Any) -> list[list[str]]:
    """Every step's drafts (decoded) of both rows, one token committed per row and step;
    `predict()` after step PREDICTED_AT hands the sidecar's prediction in."""
    steps: list[list[str]] = []
    step = 0
    while any(done < len(out) for done, out in zip(batch.done, batch.outputs, strict=True)):
        steps.append([decode(d) for d in batch.step([1] * len(batch.outputs))])
        step += 1
        if step == PREDICTED_AT:
            predict()
    return steps


def auto_worker(address: str, authkey: bytes, predict_now: Any, predicted: Any,
                results: Any) -> None:
    """The output rank (spawned): the fake runner's rows read the replica's store, the sidecar's
    prediction arriving mid-request."""
    batch = Batch([encode(t) for t in AUTO_OUTPUTS])
    runner = batch.proposer.runner
    runner.drafter = batch.proposer
    worker = SimpleNamespace(rank=0, model_runner=runner, parallel_config=SimpleNamespace(
        tensor_parallel_size=3, pipeline_parallel_size=1))
    bound = bind_remote_proposer(worker, address, authkey, tokenizer(), False, 2, 4)

    def predict() -> None:  # the replica gets it while this process waits
        predict_now.put(True)
        assert predicted.wait(timeout=60)

    steps = run_auto(batch, predict)
    batch.proposer.store.begin_step(["r0"])  # a round trip: the last records are applied
    results.put((bound, steps))


def test_the_output_rank_drafts_auto_mode_from_sidecar_and_schemas_one_exchange_a_step(
) -> None:
    """The output rank's proposer in another process (spawned, as vLLM's `mp` executor spawns
    its workers), reading the replica's store, drafts what an in-process one does: in
    `tool_choice: auto` the gate crosses (the sidecar's call once it arrives, the schemas' in a
    call nobody predicted), a forced call drafts its candidate; one exchange per engine step
    for all rows, and the accounting reaches the replica's store."""
    local = Batch([encode(t) for t in AUTO_OUTPUTS])
    local_gates = [AutoDrafts(HERMES, None, SCHEMA) for _ in range(2)]
    fill(local.store, local_gates)
    expected = run_auto(local, lambda: local_gates[0].predicted([WEATHER_CALL]))
    for source in ("sidecar", "schema", "history"):
        assert any(local.store.get(r).sources.of(source).drafted_tokens for r in local.ids)

    store = CandidateStore()
    server = StoreServer(store)
    gates = [AutoDrafts(HERMES, None, SCHEMA) for _ in range(2)]
    try:
        fill(store, gates)
        spawn = multiprocessing.get_context("spawn")
        predict_now, predicted, results = spawn.Queue(), spawn.Event(), spawn.Queue()
        process = spawn.Process(target=auto_worker, args=(
            server.address, server.authkey, predict_now, predicted, results))
        process.start()
        assert predict_now.get(timeout=120)
        gates[0].predicted([WEATHER_CALL])  # the sidecar's prediction reaches the replica
        predicted.set()
        bound, steps = results.get(timeout=120)
        process.join(timeout=60)
        assert process.exitcode == 0 and bound
        assert steps == expected, "the output rank drafts what an in-process proposer does"
        r0, r1, r2 = (store.get(f"r{i}") for i in range(3))
        assert r0 is not None and r1 is not None and r2 is not None
        assert r0.sources.of("sidecar").drafted_tokens > 0, "the late prediction crossed"
        assert r1.sources.of("schema").drafted_tokens > 0, "the schema drafts crossed"
        assert r2.sources.of("history").drafted_tokens > 0, "the forced call's candidate"
        for request_id in local.ids:  # the accounting reached the replica, all of it
            assert store.get(request_id).sources == local.store.get(request_id).sources
        # One fetch per engine step for both rows, plus the worker's closing round trip.
        assert server.exchanges == len(steps) + 1
        assert server.record_batches <= len(steps)
    finally:
        server.close()


def test_an_unchanged_entry_keeps_its_copy_and_its_candidate_lists() -> None:
    """The proposer's alignment keeps its place while the lists stay the same objects."""
    store = CandidateStore()
    server = StoreServer(store)
    try:
        gate = AutoDrafts(HERMES, None, SCHEMA)
        gate.predicted([WEATHER_CALL])
        store.open("r0", enabled=True)
        store.set_gate("r0", gate)
        remote = RemoteStore(server.address, server.authkey)
        remote.begin_step(["r0"])
        first = remote.get("r0")
        assert first is not None and first.gate is not None
        lists = first.gate.candidates("<tool_call>")
        assert lists == gate.candidates("<tool_call>")
        remote.begin_step(["r0"])
        again = remote.get("r0")
        assert again is first and again.gate is not None
        assert again.gate.candidates("<tool_call>") is lists
        gate.predicted([TIME_CALL])  # a newer prediction: the copy follows, in place
        remote.begin_step(["r0"])
        moved = remote.get("r0")
        assert moved is not None and moved.gate is first.gate
        assert moved.gate.candidates("<tool_call>") == gate.candidates("<tool_call>")
        assert moved.gate.candidates("<tool_call>") is not lists
        store.close("r0")
        remote.begin_step(["r0"])
        assert remote.get("r0") is None
        assert server.exchanges == 4
        remote.close()
    finally:
        server.close()
