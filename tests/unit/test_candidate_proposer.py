"""The candidate proposer driven step by step as vLLM's model runner drives it (a fake runner
with the batch bookkeeping only), with the embedded model's tokenizer."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.drafting.candidate_proposer import CandidateProposer
from app.drafting.candidate_store import CandidateStore
from app.drafting.draft_choice import agreed
from app.drafting.draft_policy import DraftPolicy
from app.drafting.suffix_index import TenantSuffixes
from app.speculation.draft_sources import DRAFT_SOURCES

PROMPT = 8
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


class Batch:
    """Rows that commit given tokens step by step; `step` calls `propose` like the runner."""

    def __init__(self, outputs: list[list[int]], policy: DraftPolicy | None = None,
                 k: int = 8) -> None:
        self.outputs = outputs
        self.done = [0] * len(outputs)
        self.ids = [f"r{i}" for i in range(len(outputs))]
        self.store = CandidateStore()
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                 model_config=SimpleNamespace(max_model_len=512))
        self.proposer = CandidateProposer(config)
        runner = SimpleNamespace(input_batch=SimpleNamespace(
            req_ids=self.ids, num_prompt_tokens=np.full(len(outputs), PROMPT)))
        self.proposer.bind(self.store, runner, tokenizer(), False, 2, 4, policy)
        self.tokens = np.zeros((len(outputs), 512), dtype=np.int32)
        for request_id in self.ids:
            self.store.open(request_id, enabled=True)

    def step(self, advance: list[int]) -> list[list[int]]:
        sampled = []
        for row, n in enumerate(advance):
            new = self.outputs[row][self.done[row]: self.done[row] + n]
            start = PROMPT + self.done[row]
            self.tokens[row, start: start + len(new)] = new
            self.done[row] += len(new)
            sampled.append(new)
        lengths = np.array([PROMPT + d for d in self.done])
        return self.proposer.propose(sampled, lengths, self.tokens)


def encode(text: str) -> list[int]:
    return list(tokenizer().encode(text, add_special_tokens=False))


def decode(ids: list[int]) -> str:
    return str(tokenizer().decode(ids))


def test_drafts_continue_the_candidate_until_the_end_of_output() -> None:
    output = encode(CALL)
    batch = Batch([output], k=8)
    batch.store.add_candidates("r0", [CALL])
    eos = tokenizer().eos_token_id
    while batch.done[0] < len(output):
        written = decode(output[: batch.done[0] + 1])
        draft = batch.step([1])[0]
        rest = [t for t in draft if t != eos]
        assert CALL.startswith(written + decode(rest)), (written, decode(rest))
        if batch.done[0] < len(output):
            assert rest, "a candidate that still agrees must be drafted"
    assert draft[-1] == eos  # the call is written: the end of the output comes next


def test_drafts_pick_the_candidate_up_again_after_another_value() -> None:
    written = CALL.replace("Paris", "Lyon")
    batch = Batch([encode(written)], k=4)
    batch.store.add_candidates("r0", [CALL])
    texts = []
    while batch.done[0] < len(batch.outputs[0]):
        draft = batch.step([1])[0]
        texts.append(decode(draft))
    assert any(t.startswith('celsius"') or t.startswith(' "celsius') for t in texts), texts


def test_a_schema_draft_stops_at_each_value_and_picks_up_after_it() -> None:
    """The schema's text with a stop at the city's value (the unit's enum value is drafted):
    no draft reaches into a value, none at the value itself, and after it the rest (the
    unit's key and enum value) is drafted; no end of output is drafted at a stop."""
    schema = CALL.replace("Paris", "")
    stop = schema.index('"city": "') + len('"city": "')
    batch = Batch([encode(CALL)], k=8)
    batch.store.add_candidates("r0", [schema], "schema", {schema: (stop,)})
    eos = tokenizer().eos_token_id
    texts = []
    while batch.done[0] < len(batch.outputs[0]):
        written = decode(batch.outputs[0][: batch.done[0] + 1])
        draft = batch.step([1])[0]
        texts.append(decode(draft))
        if len(written) < stop:
            assert eos not in draft and schema[:stop].startswith(written + decode(draft)), (
                written, decode(draft))
    assert "Paris" not in "".join(texts)
    assert any("celsius" in t for t in texts), texts
    assert batch.store.get("r0").sources.of("schema").drafted_tokens > 0


def test_a_row_whose_drafts_are_rejected_pauses_and_resumes() -> None:
    wrong = CALL.replace("get_weather", "get_time")
    policy = DraftPolicy(k=4, reject_streak=2, pause_steps=3)
    batch = Batch([encode(CALL)], policy, k=4)
    batch.store.add_candidates("r0", [wrong, CALL.replace("Paris", "Oslo")])
    drafted_per_step = []
    while batch.done[0] < len(batch.outputs[0]):
        drafted_per_step.append(len(batch.step([1])[0]))  # one token a step: all rejected
    entry = batch.store.get("r0")
    assert entry is not None
    assert entry.paused_steps > 0 and entry.drafted_after_pause > 0, drafted_per_step
    assert 0 in drafted_per_step[2:]


def test_a_full_batch_shares_the_step_draft_budget() -> None:
    rows = [encode(CALL)] * 4
    batch = Batch(rows, DraftPolicy(k=8, step_draft_tokens=8), k=8)
    for request_id in batch.ids:
        batch.store.add_candidates(request_id, [CALL])
    drafts = batch.step([2, 2, 2, 2])
    assert [len(d) for d in drafts] == [2, 2, 2, 2]


def test_finished_requests_are_forgotten() -> None:
    batch = Batch([encode(CALL)] * 2)
    for request_id in batch.ids:
        batch.store.add_candidates(request_id, [CALL])
    batch.step([1, 1])
    assert set(batch.proposer.tracked) == {"r0", "r1"}
    batch.store.close("r1")
    batch.step([1, 0])
    assert set(batch.proposer.tracked) == {"r0"}


def test_candidates_are_tokenized_when_added_not_on_the_step() -> None:
    batch = Batch([encode(CALL)])
    batch.store.add_candidates("r0", [CALL, CALL.replace("Paris", "Rome")])

    def no_tokenizing(text: str) -> Any:
        raise AssertionError(f"tokenized on the engine step: {text!r}")

    assert batch.proposer.tokenized is not None
    batch.proposer.tokenized._tokenize = no_tokenizing
    assert batch.step([1])[0], "drafts from the texts tokenized on arrival"


def run_accepting(batch: Batch) -> int:
    """Step row 0 to its end, committing each step what the main model would: the drafts that
    agree with the output, plus one sampled token. Returns the steps taken."""
    output = batch.outputs[0]
    steps, advance = 0, 1
    while batch.done[0] < len(output):
        draft = batch.step([advance])[0]
        steps += 1
        rest = output[batch.done[0]:]
        advance = agreed(draft, rest) + 1
    return steps


def test_the_tenants_earlier_output_drafts_and_is_counted_as_suffix() -> None:
    output = encode(CALL)
    suffixes = TenantSuffixes(max_depth=16, max_tokens=4096, max_tenants=4)
    suffixes.of("key-a").add(encode("Sure. " + CALL))
    batch = Batch([output], k=8)
    batch.store.set_suffix("r0", suffixes.of("key-a"))
    steps = run_accepting(batch)
    entry = batch.store.get("r0")
    assert entry is not None
    suffix = entry.sources.suffix
    assert suffix.accepted_tokens > len(output) // 2, suffix
    assert steps < len(output) // 2
    assert entry.sources.sidecar.drafted_tokens == entry.sources.lookup.drafted_tokens == 0


def test_another_tenants_outputs_are_never_drafted() -> None:
    output = encode(CALL)
    suffixes = TenantSuffixes(max_depth=16, max_tokens=4096, max_tenants=4)
    suffixes.of("key-a").add(encode("Sure. " + CALL))

    def drafts_with(tenant: str) -> list[list[int]]:
        batch = Batch([output], k=8)
        batch.store.set_suffix("r0", suffixes.of(tenant))
        return [batch.step([1])[0] for _ in range(len(output) - 1)]

    # key-b drafts exactly what a tenant with no past at all drafts (the output's own
    # repeats); key-a's earlier output changes key-a's drafts only.
    alone = drafts_with("key-never-served")
    assert drafts_with("key-b") == alone
    assert drafts_with("key-a") != alone


def test_each_accepted_token_is_counted_for_the_source_that_drafted_it() -> None:
    output = encode(CALL)
    suffixes = TenantSuffixes(max_depth=16, max_tokens=4096, max_tenants=4)
    suffixes.of("key-a").add(encode(CALL.replace("celsius", "kelvin")))
    batch = Batch([output], k=8)
    # A candidate that agrees up to the city (history), the tenant's last output after it.
    batch.store.add_candidates("r0", [CALL.replace("Paris", "Rome")], "history")
    batch.store.set_suffix("r0", suffixes.of("key-a"))
    steps = run_accepting(batch)
    entry = batch.store.get("r0")
    assert entry is not None
    tallies = [entry.sources.of(s) for s in DRAFT_SOURCES]
    assert entry.sources.history.accepted_tokens > 0 and entry.sources.suffix.accepted_tokens > 0
    assert sum(t.drafted_tokens for t in tallies) == entry.drafted_tokens
    # Every committed token past the first of each step was a draft some source made.
    assert sum(t.accepted_tokens for t in tallies) == len(output) - steps
