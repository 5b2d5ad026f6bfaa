"""What the main-model and sidecar services need of an engine.

`VllmEngine` (app/engine/vllm_engine.py) is the one real implementation; unit tests run
`MainModelService` and `SidecarService` against a small fake that streams scripted text
(tests/unit/fake_engine.py), so their logic is tested without vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from app.config import SpeculationConfig
    from app.drafting.auto_drafts import AutoDrafts
    from app.drafting.suffix_index import SuffixIndex
    from app.engine.vllm_engine import GenerationResult, PrefillTally, StepDelta
    from app.speculation.draft_sources import DraftSource


class DraftStore(Protocol):
    """Where candidate texts wait for the proposer (`CandidateStore`)."""

    def add_candidates(
        self, request_id: str, candidates: list[str], source: DraftSource = "sidecar",
        stops: Mapping[str, tuple[int, ...]] | None = None,
    ) -> bool: ...

    def set_gate(self, request_id: str, gate: AutoDrafts) -> bool: ...

    def set_suffix(self, request_id: str, index: SuffixIndex) -> bool: ...


class Engine(Protocol):
    # The HF tokenizer (encode, decode, the chat template); set once `start` has run.
    tokenizer: Any
    # The candidate proposer's settings; None: this engine drafts nothing of ours.
    speculation: SpeculationConfig | None
    # Prompt tokens prefilled and served by the prefix cache, for the deployment's metrics.
    prefills: PrefillTally

    @property
    def store(self) -> DraftStore: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def healthy(self) -> bool: ...

    def counters(self) -> dict[str, int]: ...

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def stream(
        self,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        speculate: bool = False,
        on_start: Callable[[str], None] | None = None,
        realign: bool = True,
        cache_salt: str | None = None,
        sized: bool = True,
    ) -> AsyncIterator[StepDelta]:
        """One `StepDelta` per forward pass; `on_start(request_id)` once the engine has the
        request (the id drafts are stored under). Closing the iterator aborts the request."""
        ...

    async def generate(
        self, prompt_token_ids: list[int], sampling: dict[str, Any]
    ) -> GenerationResult: ...
