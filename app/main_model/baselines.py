"""Comparison engines: the main model served with vLLM's own speculation instead of ours.

A baseline is a further `MainModelService` whose engine runs the same model with a vLLM
speculative method and no candidate proposer, so one server can answer the same request several
ways and the benchmark compares like with like: `ngram` (prompt lookup) and `suffix` (suffix
decoding over the prompt and the engine's earlier outputs, from the `arctic-inference` package).
"""

from __future__ import annotations

from typing import Any

from app.config import AppConfig, EngineConfig
from app.engine.vllm_engine import VllmEngine
from app.engine.vllm_suffix import SUFFIX_MISSING, suffix_available
from app.main_model.service import MainModelService

NGRAM = "ngram"
SUFFIX = "suffix"
BASELINES = (NGRAM, SUFFIX)


def baseline_engine(config: AppConfig, name: str) -> tuple[EngineConfig, dict[str, Any]]:
    """(engine settings, vLLM `speculative_config`) of baseline `name`."""
    if name == NGRAM:
        ngram = config.baselines.ngram
        return ngram.engine or config.main.engine, ngram.speculative_config()
    if name == SUFFIX:
        suffix = config.baselines.suffix
        return suffix.engine or config.main.engine, suffix.speculative_config()
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


def baseline_service(config: AppConfig, name: str) -> MainModelService:
    """The main-model service of baseline `name`, not started."""
    engine, speculative = baseline_engine(config, name)
    if name == SUFFIX and not suffix_available():
        raise RuntimeError(SUFFIX_MISSING)
    # The service takes context length and the served name from `main.engine`: this engine's.
    view = config.model_copy(
        update={"main": config.main.model_copy(update={"engine": engine})}
    )
    return MainModelService(view, VllmEngine(engine, vllm_speculative=dict(speculative)))
