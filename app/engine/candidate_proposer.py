"""vLLM custom proposer that turns each request's candidates into draft tokens.

Configured as `speculative_config={"method": "custom_class",
"model": "app.engine.candidate_proposer.CandidateProposer", ...}`. vLLM builds it inside the
model runner with only the `VllmConfig`; `bind_proposer` (run through `collective_rpc` on the
in-process worker) then hands it the `CandidateStore` and the runner, so it can tell which batch
row is which request. This only works because the engine core runs in the serving process
(see `vllm_engine.py` for why we drive an in-process `LLMEngine`).

The main model verifies every draft with vLLM's rejection sampler; a wrong draft costs a few
wasted positions in one forward pass, never a different output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.alignment import best_remainder, prompt_lookup
from app.engine.candidate_store import CandidateStore


class CandidateProposer:
    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k: int = int(spec.num_speculative_tokens)
        self.max_model_len: int = int(vllm_config.model_config.max_model_len)
        self.store: CandidateStore | None = None
        self.runner: Any = None
        self.tokenizer: Any = None
        self.eos_token_id: int | None = None
        self.prompt_lookup_fallback = False
        self.lookup_min = 2
        self.lookup_max = 4

    def bind(
        self,
        store: CandidateStore,
        runner: Any,
        tokenizer: Any,
        prompt_lookup_fallback: bool,
        lookup_min: int,
        lookup_max: int,
    ) -> None:
        self.store = store
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.prompt_lookup_fallback = prompt_lookup_fallback
        self.lookup_min = lookup_min
        self.lookup_max = lookup_max

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
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled or row >= len(req_ids):
                continue
            entry = self.store.get(req_ids[row])
            if entry is None or not entry.enabled:
                continue
            num_tokens = int(num_tokens_no_spec[row])
            budget = min(self.k, self.max_model_len - num_tokens - 1)
            if budget <= 0:
                continue
            draft: list[int] = []
            if entry.candidates:
                prompt_len = int(batch.num_prompt_tokens[row])
                generated = token_ids_cpu[row, prompt_len:num_tokens].tolist()
                draft = self._candidate_draft(
                    generated, entry.candidates, budget, entry.realign
                )
            if not draft and self.prompt_lookup_fallback:
                draft = prompt_lookup(
                    token_ids_cpu[row, :num_tokens].tolist(),
                    budget,
                    self.lookup_min,
                    self.lookup_max,
                )
            if draft:
                drafts[row] = draft
                self.store.record_draft(req_ids[row], len(draft))
        return drafts

    def _candidate_draft(
        self, generated: list[int], candidates: list[str], k: int, realign: bool = True
    ) -> list[int]:
        text = self.tokenizer.decode(generated, skip_special_tokens=False)
        remainder = best_remainder(text, candidates, realign)
        if remainder is None:
            return []
        ids = self.tokenizer.encode(remainder, add_special_tokens=False)[:k] if remainder else []
        # Past the end of the call comes the end of the output: draft that too.
        if len(ids) < k and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids


def bind_proposer(
    worker: Any,
    store: CandidateStore,
    tokenizer: Any,
    prompt_lookup_fallback: bool,
    lookup_min: int,
    lookup_max: int,
) -> bool:
    """Run on the worker via `collective_rpc`: connect the runner's proposer to the store."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, CandidateProposer):
        return False
    drafter.bind(store, runner, tokenizer, prompt_lookup_fallback, lookup_min, lookup_max)
    return True
