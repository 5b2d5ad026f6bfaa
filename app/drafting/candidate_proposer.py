"""vLLM custom proposer that turns each request's candidates into draft tokens.

Configured as `speculative_config={"method": "custom_class",
"model": "app.drafting.candidate_proposer.CandidateProposer", ...}`. vLLM builds it inside the
model runner with only the `VllmConfig`; `bind_proposer` (run through `collective_rpc` on the
in-process worker) then hands it the `CandidateStore` and the runner, so it can tell which batch
row is which request. This only works because the engine core runs in the serving process
(see `vllm_engine.py` for why we drive an in-process `LLMEngine`).

The main model verifies every draft with vLLM's rejection sampler; a wrong draft costs a few
wasted positions in one forward pass, never a different choice of token by the model. The
output is token-identical to plain decoding in float32 (tested on CPU); in bfloat16 on a GPU a
verifying pass computes other kernel shapes than one-token decoding, so near-tied logits can
pick another token, as with vLLM's own speculative decoding, unless the engine runs vLLM's
batch-invariant kernels (`engine.batch_invariant`; docs/speculation.md).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from app.drafting.alignment import prompt_lookup_match
from app.drafting.candidate_store import CandidateStore, ProposerStore, RequestSpeculation
from app.drafting.draft_choice import PendingDraft, Proposal, SourceRates, choose, could_win
from app.drafting.draft_policy import DraftPolicy
from app.drafting.draft_worth import PassClock, matcher_cap, sized
from app.drafting.request_alignment import (
    TokenizedCandidate,
    TokenizedCandidates,
    TrackedRequest,
)
from app.drafting.suffix_index import suffix_match


class CandidateProposer:
    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k: int = int(spec.num_speculative_tokens)
        self.max_model_len: int = int(vllm_config.model_config.max_model_len)
        self.store: ProposerStore | None = None
        self.runner: Any = None
        self.tokenizer: Any = None
        self.eos_token_id: int | None = None
        self.prompt_lookup_fallback = False
        self.lookup_min = 2
        self.lookup_max = 4
        self.policy = DraftPolicy(k=self.k)
        self.tokenized: TokenizedCandidates | None = None
        # Per engine request id; dropped when the request leaves the store.
        self.tracked: dict[str, TrackedRequest] = {}
        # Decode steps' times against the tokens they verified (app/drafting/draft_worth.py).
        self.clock = PassClock()
        self._last_step: tuple[float, frozenset[str], int] | None = None
        self._backend: Any = None

    def bind(
        self,
        store: ProposerStore,
        runner: Any,
        tokenizer: Any,
        prompt_lookup_fallback: bool,
        lookup_min: int,
        lookup_max: int,
        policy: DraftPolicy | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.prompt_lookup_fallback = prompt_lookup_fallback
        self.lookup_min = lookup_min
        self.lookup_max = lookup_max
        self.policy = policy or DraftPolicy(k=self.k)
        # The Rust tokenizer under a Hugging Face fast tokenizer: the Python wrapper's
        # per-call overhead was most of the proposer's time at large batches.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tokenized = TokenizedCandidates(self._tokenize, self._encode)
        store.prepare = self.tokenized.warm

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: drafts come from candidates, not from a draft model."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.store is None or self.runner is None:
            return drafts
        batch = self.runner.input_batch
        req_ids: list[str] = batch.req_ids
        active = sum(1 for sampled in sampled_token_ids if sampled)
        # The last step's verified tokens (its rows and their drafts) stand in for this one's.
        verified = self._last_step[2] if self._last_step is not None else active
        self._time_step(req_ids, sampled_token_ids, active)
        budget_per_row = self.policy.batch_budget(active)
        cost = self.policy.worth.cost(active, self.clock, verified)
        drafted_tokens = 0
        # One fetch for the step: the rows that run, and the requests kept from earlier steps
        # (whether they are gone). Across processes this is the step's one exchange.
        self.store.begin_step(
            {*(req_ids[row] for row, sampled in enumerate(sampled_token_ids)
               if sampled and row < len(req_ids)), *self.tracked})
        seen: set[str] = set()
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled or row >= len(req_ids):
                continue
            req_id = req_ids[row]
            entry = self.store.get(req_id)
            if entry is None or not entry.enabled:
                continue
            seen.add(req_id)
            tracked = self.tracked.get(req_id)
            if tracked is None:
                tracked = self.tracked[req_id] = TrackedRequest()
            tracked.acceptance.observe(len(sampled), self.policy)
            if tracked.pending is not None:
                self._settle(req_id, tracked, tracked.pending, sampled)
            num_tokens = int(num_tokens_no_spec[row])
            budget = min(budget_per_row, self.max_model_len - num_tokens - 1)
            prompt_len = int(batch.num_prompt_tokens[row])
            # The text must follow every committed token even on steps that do not draft.
            piece = tracked.advance(token_ids_cpu[row, prompt_len:num_tokens], self._decode)
            if tracked.acceptance.paused or budget <= 0:
                if tracked.acceptance.paused:
                    self.store.record_pause(req_id)
                # The anchors did not follow this step's text: search again when drafting.
                tracked.anchor = tracked.others_anchor = None
                continue
            proposals = self._sized(
                self._proposals(entry, tracked, piece, token_ids_cpu[row, :num_tokens], budget),
                tracked.rates, cost if entry.sized else 0.0)
            chosen = choose(proposals, tracked.rates)
            if chosen is not None:
                drafts[row] = chosen.tokens
                drafted_tokens += len(chosen.tokens)
                tracked.acceptance.drafted = len(chosen.tokens)
                tracked.pending = PendingDraft(
                    chosen, tuple(p for p in proposals if p is not chosen))
                self.store.record_draft(req_id, len(chosen.tokens), chosen.source)
        self._forget_finished(seen)
        self.store.end_step()  # the step's accounting, across processes without an answer
        if self._last_step is not None:
            self._last_step = (*self._last_step[:2], active + drafted_tokens)
        return drafts

    def _time_step(self, req_ids: list[str], sampled: list[list[int]], active: int) -> None:
        """Feed the pass clock the step that just ran, when it was a decode step of the same
        rows as the step before (a prefill, or a row joining or leaving, is not comparable),
        with the tokens it verified (the rows' own plus last step's drafts)."""
        now = time.perf_counter()
        rows = frozenset(req_ids[:len(sampled)])
        last = self._last_step
        if (last is not None and last[1] == rows and active == len(rows)
                and all(sampled)):
            self.clock.observe(last[2], now - last[0])
        self._last_step = (now, rows, active)

    def _sized(self, proposals: list[Proposal], rates: SourceRates, cost: float
               ) -> list[Proposal]:
        """Each proposal cut to what it is worth (app/drafting/draft_worth.py)."""
        if cost <= 0:
            return proposals
        factor = self.policy.worth.max_spec_factor
        out = []
        for proposal in proposals:
            cap = matcher_cap(proposal.match, factor) if proposal.source == "suffix" else None
            tokens = sized(proposal.tokens, proposal.rates(rates), cost, cap)
            if tokens:
                out.append(Proposal(proposal.source, tokens, proposal.match,
                                    proposal.odds[:len(tokens)]))
        return out

    def _proposals(
        self,
        entry: RequestSpeculation,
        tracked: TrackedRequest,
        piece: str,
        tokens: np.ndarray,
        budget: int,
    ) -> list[Proposal]:
        """Every source's continuation for the row this step (app/drafting/draft_choice.py
        picks one)."""
        proposals: list[Proposal] = []
        # Auto mode: the gate picks the candidates that fit the output so far (none in a
        # text answer, the calls and schema drafts once a call opens).
        candidates = (entry.gate.candidates(tracked.text) if entry.gate is not None
                      else entry.candidates)
        sidecar = False
        if candidates:
            anchor = tracked.locate(piece, candidates, entry.realign)
            if anchor is not None:
                text = candidates[anchor[0]]
                source = entry.source_of(text)
                proposals.append(Proposal(source, self._candidate_draft(
                    text, anchor[1], budget, entry.stops_of(text))))
                sidecar = source == "sidecar"
        else:
            tracked.anchor = None
        if sidecar:
            # What the other candidates (history, schemas) would draft here: the sidecar's
            # gain is measured against them too, not only against the token matchers.
            other = tracked.locate_others(
                piece, candidates, lambda c: entry.source_of(c) != "sidecar", entry.realign)
            if other is not None:
                proposals.append(Proposal(entry.source_of(other[0]), self._candidate_draft(
                    other[0], other[1], budget, entry.stops_of(other[0]))))
        else:
            tracked.others_anchor = None
        # The token matchers only where they could be chosen (or the sidecar's gain needs
        # them): each searches the request's whole context.
        proposals = [p for p in proposals if p.tokens]
        if entry.suffix is not None and (
                sidecar or could_win("suffix", budget, proposals, tracked.rates)):
            found = suffix_match(entry.suffix, tokens, budget)
            if found is not None:
                proposals.append(Proposal("suffix", found.tokens, found.length, found.odds))
        if self.prompt_lookup_fallback and (
                sidecar or could_win("lookup", budget, proposals, tracked.rates)):
            matched, follow = prompt_lookup_match(tokens, budget, self.lookup_min,
                                                  self.lookup_max)
            proposals.append(Proposal("lookup", follow, matched))
        return [p for p in proposals if p.tokens]

    def _settle(
        self, req_id: str, tracked: TrackedRequest, pending: PendingDraft, committed: list[int]
    ) -> None:
        """Count what the last step's draft earned for its source."""
        assert self.store is not None
        earned = pending.settle(committed)
        tracked.rates.observe(pending.chosen.source, len(pending.chosen.tokens),
                              earned.accepted_tokens)
        self.store.record_settled(req_id, pending.chosen.source, earned)
        tracked.pending = None

    def _candidate_draft(self, candidate: str, position: int, k: int,
                         stops: tuple[int, ...] = ()) -> list[int]:
        """Up to `k` tokens of `candidate` from `position`, to its next stop (where a value
        the schema leaves open begins) or on to the end of the output."""
        assert self.tokenized is not None
        stop = next((at for at in stops if at >= position), None)
        ids = self.tokenized.draft(candidate, position, k, stop)
        # Past the end of the call comes the end of the output: draft that too.
        if stop is None and len(ids) < k and self.eos_token_id is not None:
            ids = [*ids, self.eos_token_id]
        return ids

    def _forget_finished(self, seen: set[str]) -> None:
        """Drop what is kept for requests the store no longer holds (finished, aborted)."""
        assert self.store is not None
        if len(self.tracked) == len(seen):  # every tracked request ran this step
            return
        for req_id in [r for r in self.tracked if r not in seen and self.store.get(r) is None]:
            del self.tracked[req_id]

    def _encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: Any) -> str:
        # No clean-up of spaces: text decoded step by step must equal text decoded whole.
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()  # plain ints: far cheaper to hand to the tokenizer
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=False))
        return str(self.tokenizer.decode(ids, skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False))

    def _tokenize(self, text: str) -> TokenizedCandidate:
        if self._backend is not None:
            encoding = self._backend.encode(text, add_special_tokens=False)
            ids = list(encoding.ids)
            # Offsets tile the text only if the tokens decode back to it as well.
            found = TokenizedCandidate.from_offsets(text, ids, encoding.offsets)
            if found is not None and self._decode(ids) == text:
                return found
            pieces = self._backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
        else:
            ids = self._encode(text)
            pieces = self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                                 clean_up_tokenization_spaces=False)
        return TokenizedCandidate.from_pieces(text, ids, pieces)


def bind_proposer(
    worker: Any,
    store: CandidateStore,
    tokenizer: Any,
    prompt_lookup_fallback: bool,
    lookup_min: int,
    lookup_max: int,
    policy: DraftPolicy | None = None,
) -> bool:
    """Run on the worker via `collective_rpc`: connect the runner's proposer to the store."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, CandidateProposer):
        return False
    drafter.bind(store, runner, tokenizer, prompt_lookup_fallback, lookup_min, lookup_max,
                 policy)
    return True
