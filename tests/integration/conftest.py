"""The integration tests' one in-process engine (the embedded model, float32): the lossless
tests and the tool formats' engine tests share it, so the package starts it once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.config import EngineConfig, SpeculationConfig
from app.engine.vllm_engine import VllmEngine


@pytest.fixture(scope="package")
def engine() -> Iterator[VllmEngine]:
    eng = VllmEngine(
        EngineConfig(model="embedded", dtype="float32", max_model_len=2048, kv_cache_gib=0.5),
        SpeculationConfig(num_speculative_tokens=16, prompt_lookup_fallback=True),
    )
    eng.start()
    yield eng
    eng.stop()
