"""The training as a Ray Train job (`--trainer ray`): the cluster's way, GPUs when asked.

`TorchTrainer` runs `train_loop` on `workers` workers; Ray Train sets up the process group
(gloo on CPU, NCCL on GPU). Each worker loads the sidecar model with the same seeded adapter,
owns the pairs `i % workers == rank` (and computes only their trunk states), and at step `s`
takes its part of the global batch with `batch_indices` over its own pairs, `batch_size /
workers` of them, so a one-worker job takes exactly the in-process loop's batches. The LoRA
gradients (the only trainable weights, under a megabyte) are averaged across workers with one
all-reduce per step rather than through DDP: the steps run the model's top layers on cached
trunk states (`train.target_logits`), not the wrapped model's forward, which DDP's gradient
hooks rely on.

Checkpoints are Ray Train's (`ray.train.report` every `checkpoint_every` steps, a folder in
PEFT's format plus the optimizer and the step, as `train._save_checkpoint` writes it) under
`RunConfig(storage_path=<out>/ray, name="distill")`; Ray Train V2 resumes a run of the same
name and storage from its latest checkpoint, so running the command again resumes, as the
in-process loop does from `<out>/checkpoint`. Rank 0 alone saves the adapter, so at the end
the workers check that they all hold the same one (an all-gather) and fail the job if not.
The driver copies the last checkpoint's adapter to `<out>/adapter`. On a cluster,
`storage_path` must be storage every node reaches (Ray Train's rule) and the model folder
must be on every worker's node.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.distill.pairs import Pair
from app.distill.train import (
    ADAPTER,
    TrainSettings,
    _load_checkpoint,
    _save_checkpoint,
    batch_indices,
    batch_loss,
    load_model,
    portable_adapter,
    trunk_states,
)
from app.engine.engine_args import omp_threads

RUN_NAME = "distill"
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def shard(n: int, rank: int, workers: int) -> list[int]:
    """The pair indices worker `rank` of `workers` owns."""
    return list(range(rank, n, workers))


def worker_batch_size(batch_size: int, workers: int) -> int:
    if batch_size % workers:
        raise ValueError(f"--batch-size {batch_size} must be a multiple of --workers {workers}")
    return batch_size // workers


def train_loop(config: dict[str, Any]) -> None:
    """One worker of the job (Ray Train's `train_loop_per_worker`)."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    # The worker's CPU count from Ray, applied: `distill` collects with an in-process engine
    # first, whose vLLM preloads libgomp into the workers, so the variable alone is ignored
    # (app/engine/engine_args.py, intra_op_threads).
    threads = omp_threads(os.environ)
    if threads is not None:
        torch.set_num_threads(threads)
    settings = TrainSettings(**{**config["settings"], "modules": tuple(config["settings"]
                                                                       ["modules"])})
    context = ray.train.get_context()
    rank, workers = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    pairs = [Pair.model_validate(p) for p in config["pairs"]]
    mine = [pairs[i] for i in shard(len(pairs), rank, workers)]
    model = load_model(config["model_path"], settings).to(device)
    states = [s.to(device) for s in trunk_states(model, mine, config["pad_id"])]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=0.0)
    step, loss_value = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            step, loss_value = _load_checkpoint(model, optimizer, Path(folder))
    per_worker = worker_batch_size(settings.batch_size, workers)
    model.train()
    while step < settings.steps:
        chosen = batch_indices(len(mine), per_worker, step, settings.seed)
        loss = batch_loss(model, mine, states, chosen)
        loss.backward()
        if workers > 1:
            for p in trainable:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= workers
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        loss_value = float(loss.item())
        metrics = {"step": step, "loss": loss_value}
        if step % settings.checkpoint_every == 0 or step == settings.steps:
            with tempfile.TemporaryDirectory() as scratch:
                folder = Path(scratch) / "checkpoint"
                if rank == 0:
                    _save_checkpoint(model, optimizer, step, loss_value, folder)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(
                    str(folder)) if rank == 0 else None)
        else:
            ray.train.report(metrics)
    if workers > 1 and not replicas_agree(trainable, workers):
        # Rank 0 alone saves the adapter: it stands for the others only if they are the same.
        raise RuntimeError("the workers' adapters differ after training (gradients not "
                           "all-reduced?)")


def replicas_agree(params: Sequence[Any], workers: int) -> bool:
    """Whether every worker holds the same weights `params` (an all-gather of them)."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([p.detach().flatten() for p in params])
    gathered = [torch.empty_like(flat) for _ in range(workers)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def train_on_ray(
    model_path: str, pairs: Sequence[Pair], pad_id: int, out: Path, settings: TrainSettings,
    workers: int, use_gpu: bool,
) -> float | None:
    """Run the job (on the Ray cluster this process is connected to, or a local one) and copy
    the trained adapter to `out/adapter`; the last loss."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    worker_batch_size(settings.batch_size, workers)  # refuse before starting anything
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"model_path": model_path, "pad_id": pad_id,
                           "settings": asdict(settings),
                           "pairs": [p.model_dump() for p in pairs]},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name=RUN_NAME, storage_path=str((out / "ray").resolve())),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError("the Ray Train job reported no checkpoint")
    adapter = out / ADAPTER
    adapter.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as folder:
        for name in PEFT_FILES:
            shutil.copy2(Path(folder) / name, adapter / name)
    portable_adapter(adapter)
    loss = (result.metrics or {}).get("loss")
    return float(loss) if loss is not None else None
