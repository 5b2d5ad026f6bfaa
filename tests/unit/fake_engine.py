"""A fake engine (app/engine/protocol.py's `Engine`) for unit tests of the main-model and
sidecar services: it streams scripted text, one forward pass per piece, and records the
drafts offered to it. No vLLM, no tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from app.config import SpeculationConfig
from app.drafting.auto_drafts import AutoDrafts
from app.drafting.suffix_index import SuffixIndex
from app.engine.pass_ledger import record_pass
from app.engine.vllm_engine import GenerationResult, GenerationTally, PrefillTally, StepDelta
from app.speculation.draft_sources import DraftSource


class RecordingStore:
    def __init__(self) -> None:
        self.added: list[tuple[str, list[str]]] = []
        self.gates: list[tuple[str, AutoDrafts]] = []
        self.sources: list[tuple[str, DraftSource]] = []
        self.stops: dict[str, tuple[int, ...]] = {}
        self.suffixes: list[tuple[str, SuffixIndex]] = []
        self.filled = asyncio.Event()

    def add_candidates(self, request_id: str, candidates: list[str],
                       source: DraftSource = "sidecar",
                       stops: Mapping[str, tuple[int, ...]] | None = None) -> bool:
        self.added.append((request_id, candidates))
        self.stops.update(stops or {})
        self.sources.extend((text, source) for text in candidates)
        self.filled.set()
        return True

    def set_suffix(self, request_id: str, index: SuffixIndex) -> bool:
        self.suffixes.append((request_id, index))
        return True

    def set_gate(self, request_id: str, gate: AutoDrafts) -> bool:
        self.gates.append((request_id, gate))
        return True


class FakeEngine:
    """`pieces`: the text of each forward pass (one token each). `gate`, when given, is awaited
    after the request starts and before the first piece (e.g. until drafts arrived)."""

    def __init__(self, pieces: list[str], speculation: bool = True,
                 gate: Callable[[FakeEngine], Awaitable[Any]] | None = None,
                 fail: Exception | None = None) -> None:
        self.pieces = pieces
        self.tokenizer: Any = None
        self.speculation = SpeculationConfig() if speculation else None
        self.store = RecordingStore()
        self.prefills = PrefillTally()
        self.gate = gate
        self.fail = fail
        self.requests: list[tuple[list[int], dict[str, Any]]] = []
        # Per request, the object whose `on_start` the service handed in (the main model's
        # candidate feed): a gate can wait on what it has received.
        self.feeds: list[Any] = []
        self.healthy = True
        self.passes = 0  # as VllmEngine.passes: one per piece written

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {"requests": len(self.requests)}

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    async def stream(
        self,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        speculate: bool = False,
        on_start: Callable[[str], None] | None = None,
        realign: bool = True,
        cache_salt: str | None = None,
        sized: bool = True,
    ) -> AsyncIterator[StepDelta]:
        self.requests.append((prompt_token_ids, sampling))
        if self.fail is not None:
            raise self.fail
        request_id = f"req-{len(self.requests) - 1}"
        if on_start is not None:
            self.feeds.append(getattr(on_start, "__self__", None))
            on_start(request_id)
        if self.gate is not None:
            await self.gate(self)
        for index, text in enumerate(self.pieces):
            last = index == len(self.pieces) - 1
            self.passes += 1
            # As VllmEngine.stream: the pass that wrote the tokens goes to the current ledger.
            record_pass(self.passes)
            yield StepDelta([100 + index], text, last, "stop" if last else None, float(index),
                            pass_index=self.passes)
            await asyncio.sleep(0)  # a pass's turn of the loop, as a real engine; not a wait

    async def generate(
        self, prompt_token_ids: list[int], sampling: dict[str, Any]
    ) -> GenerationResult:
        tally = GenerationTally(len(prompt_token_ids), 0.0)
        async for delta in self.stream(prompt_token_ids, sampling):
            tally.add(delta)
        return tally.result()
