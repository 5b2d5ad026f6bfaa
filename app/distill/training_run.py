"""One training run of the sidecar's adapter: the held-out agreement before, the training
(here, `train.py`, or as a Ray Train job, `ray_job.py`), the agreement after, the report.

Above both trainers, so the Ray job imports the trainer and never the reverse.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.distill.pairs import Pair
from app.distill.train import (
    ADAPTER,
    TrainSettings,
    greedy_agrees,
    load_model,
    train,
    trunk_states,
)


def run_training(
    model_path: str, train_pairs: Sequence[Pair], held_out: Sequence[Pair], out: Path,
    settings: TrainSettings, progress: bool = True, ray_workers: int | None = None,
    use_gpu: bool = False,
) -> Any:
    """Load, measure the held-out agreement without the adapter, train (here, or as a Ray
    Train job of `ray_workers` workers: `ray_job.py`), measure again; writes and returns the
    `TrainingReport`."""
    from transformers import AutoTokenizer

    from app.distill.report import TrainingReport, agreement, report_json

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model = load_model(model_path, settings)
    held_out_states = trunk_states(model, held_out, pad_id, progress=progress, what="held out")
    with model.disable_adapter():
        before = agreement(held_out, greedy_agrees(model, held_out, held_out_states))
    started = time.perf_counter()
    if ray_workers:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        from app.distill.ray_job import train_on_ray

        loss = train_on_ray(model_path, train_pairs, pad_id, out, settings, ray_workers,
                            use_gpu)
        set_peft_model_state_dict(model, load_file(str(out / ADAPTER /
                                                       "adapter_model.safetensors")))
    else:
        train_states = trunk_states(model, train_pairs, pad_id, progress=progress,
                                    what="training")
        loss = train(model, train_pairs, train_states, out, settings, progress)
    seconds = time.perf_counter() - started
    after = agreement(held_out, greedy_agrees(model, held_out, held_out_states))
    report = TrainingReport(seed=settings.seed, steps=settings.steps,
                            train_pairs=len(train_pairs), held_out_pairs=len(held_out),
                            final_loss=loss, train_seconds=seconds, before=before, after=after)
    (out / "report.json").write_text(report_json(report))
    return report
