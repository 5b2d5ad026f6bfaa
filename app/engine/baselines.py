"""Comparison engines: the main model served with vLLM's own speculation instead of ours.

A baseline is a second `MainModelService` whose engine runs the same model with a vLLM
speculative method (today `ngram`, prompt lookup) and no candidate proposer, so one server can
answer the same request both ways and the benchmark compares like with like.
"""

from __future__ import annotations

from app.config import AppConfig
from app.engine.main_model import MainModelService
from app.engine.vllm_engine import VllmEngine

NGRAM = "ngram"
BASELINES = (NGRAM,)


def baseline_service(config: AppConfig, name: str) -> MainModelService:
    """The main-model service of baseline `name`, not started."""
    if name != NGRAM:
        raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    ngram = config.baselines.ngram
    engine = ngram.engine or config.main.engine
    # The service takes context length and the served name from `main.engine`: this engine's.
    view = config.model_copy(
        update={"main": config.main.model_copy(update={"engine": engine})}
    )
    return MainModelService(view, VllmEngine(engine, vllm_speculative=ngram.speculative_config()))
