"""`ooo-spec sidecar distill`: collect, render, train, report, in one resumable command.

Everything goes under `--out`:
- `samples.jsonl`: the main model's committed calls, appended case by case (a rerun collects
  only the cases of `--sources` and `--limit` it does not hold yet);
- `pairs.jsonl`: the training pairs, rendered again on every run (cheap, and always what
  today's sidecar code renders);
- `checkpoint/`: the training state every `--checkpoint-every` steps (a rerun resumes);
- `adapter/`: the finished adapter, for `sidecar.lora.path`;
- `report.json`: held-out agreement before and after;
- a copy of the `--config` Serve config with `sidecar.lora` set to the adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from app.config import AppConfig


def load_app_config(path: str) -> AppConfig:
    """The app's config from a Serve config file (its first application's args)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    applications = data.get("applications") or [{}]
    return AppConfig.model_validate(applications[0].get("args") or {})


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def collect_samples(config: AppConfig, args: argparse.Namespace, path: Path) -> None:
    """The main model's calls on the cases of `--sources` not collected into `path` yet."""
    from tqdm import tqdm

    from app.distill.collect import (
        AGENT_SOURCE,
        CollectionLog,
        DistillCase,
        collect,
        load_cases,
        tool_listing,
    )
    from app.distill.pairs import Sample
    from app.main_model.service import MainModelService

    log = CollectionLog(path)
    sources = args.sources.split(",")
    # The agent scenarios' tools: the ones this config's tool workers would list.
    listing = asyncio.run(tool_listing(config)) if AGENT_SOURCE in sources else None
    cases = load_cases(sources, args.limit, listing)
    done = log.done()
    todo = [c for c in cases if c.id not in done]
    _say(f"ooo-spec: {len(cases)} cases ({args.sources}, up to {args.limit} each), "
         f"{len(cases) - len(todo)} collected before")
    if not todo:
        return
    service = MainModelService(config)
    service.start()
    bar = tqdm(total=len(todo), desc="collecting", unit="req", disable=args.no_progress)

    def done_one(case: DistillCase, sample: Sample | None) -> None:
        log.add(case, sample)
        bar.update(1)

    try:
        asyncio.run(collect(service, todo, args.concurrency, on_done=done_one))
    finally:
        bar.close()
        service.engine.stop()
    _say(f"ooo-spec: the main model's calls in {path}")


def run(args: argparse.Namespace) -> int:
    from app.distill.collect import read_samples
    from app.distill.pairs import balance_more, offline_sidecar, render_pairs, split
    from app.distill.report import format_report
    from app.distill.train import ADAPTER, TrainSettings
    from app.distill.training_run import run_training
    from app.engine.embedded_model import resolve_model_path

    config = load_app_config(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # also when the samples come from --samples
    samples_path = Path(args.samples) if args.samples else out / "samples.jsonl"
    if not args.samples:
        collect_samples(config, args, samples_path)
    # In case order, not the order the collection finished them in: the pairs' order is the
    # training's batch order, so the same samples give the same adapter.
    samples = sorted(read_samples(samples_path), key=lambda s: s.case_id)
    sidecar = offline_sidecar(config)
    kinds: Any = tuple(args.kinds.split(","))
    pairs = [p for s in samples for p in render_pairs(s, sidecar, kinds)]
    pairs = [p for p in pairs if len(p.prompt_ids) + len(p.target_ids)
             <= config.sidecar.engine.max_model_len]
    (out / "pairs.jsonl").write_text("".join(p.model_dump_json() + "\n" for p in pairs))
    train_pairs, held_out = split(pairs, args.held_out, args.seed)
    train_pairs = balance_more(train_pairs, args.seed)  # held out: as the sources give them
    _say(f"ooo-spec: {len(pairs)} pairs from {len(samples)} calls: {len(train_pairs)} to train "
         f"on, {len(held_out)} held out")
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size,
                             learning_rate=args.learning_rate, rank=args.rank,
                             alpha=2 * args.rank, seed=args.seed,
                             checkpoint_every=args.checkpoint_every,
                             layers=args.layers or None,
                             modules=tuple(args.modules.split(",")))
    report = run_training(resolve_model_path(config.sidecar.engine.model), train_pairs,
                          held_out, out, settings, progress=not args.no_progress,
                          ray_workers=args.workers if args.trainer == "ray" else None,
                          use_gpu=args.gpu)
    print(format_report(report))
    served = out / Path(args.config).name
    served.write_text(serve_config_with_adapter(Path(args.config).read_text(encoding="utf-8"),
                                                (out / ADAPTER).resolve(), args.rank))
    _say(f"ooo-spec: adapter in {out / ADAPTER}; {served} is {args.config} serving it "
         f"(sidecar.lora)")
    return 0


def serve_config_with_adapter(serve_config: str, adapter: Path, rank: int) -> str:
    """The Serve config with `sidecar.lora` set to the adapter in every application."""
    import yaml

    data = yaml.safe_load(serve_config) or {}
    for application in data.get("applications") or []:
        sidecar = application.setdefault("args", {}).setdefault("sidecar", {})
        sidecar["lora"] = {"path": str(adapter), "max_rank": rank}
    return str(yaml.safe_dump(data, sort_keys=False))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.distill.collect import DEFAULT_SOURCES
    from app.distill.pairs import DEFAULT_KINDS
    from app.distill.train import TARGET_MODULES

    parser.add_argument("--config", default="configs/local.yaml",
                        help="Serve config whose main and sidecar engines are distilled")
    parser.add_argument("--out", default="distill_out",
                        help="output folder (a rerun resumes from what is there)")
    parser.add_argument("--samples", default=None,
                        help="collected samples (JSON Lines) to use instead of collecting")
    parser.add_argument("--sources", default=",".join(DEFAULT_SOURCES),
                        help="comma-separated sources: bfcl:<category> (BFCL's cases), "
                        "toolsets:<category> (its questions with synthetic tool sets: their "
                        "own tools plus other questions'), agent (the agent scenarios, over "
                        "the tools this config's tool workers register); the benchmark's "
                        "simple_python and multiple are refused")
    parser.add_argument("--limit", type=int, default=40, help="cases per source")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="requests the main engine decodes at once while collecting")
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help="pair kinds to train on: name (with sidecar.lora.tool_choice), "
                        "slot, refill (slots after the values before them, as sidecar.waves "
                        "serves them), more, call")
    parser.add_argument("--held-out", type=float, default=0.2,
                        help="share of the cases held out for the agreement report")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per step")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="AdamW's, constant")
    parser.add_argument("--rank", type=int, default=16, choices=(8, 16, 32, 64),
                        help="the LoRA rank (alpha is twice it)")
    parser.add_argument("--layers", type=int, default=8,
                        help="top decoder layers that carry the adapter (0: all). The layers "
                        "below are run once per pair, not at every step")
    parser.add_argument("--modules", default=",".join(TARGET_MODULES),
                        help="linear layers of each adapted layer that carry the adapter (on "
                        "CPU each one vLLM wraps costs the sidecar time)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the split, the batch order and the adapter's weights")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="steps between checkpoints")
    parser.add_argument("--trainer", choices=("local", "ray"), default="local",
                        help="local: this process; ray: a Ray Train job (TorchTrainer) on the "
                        "Ray cluster this machine is connected to (RAY_ADDRESS) or a local one")
    parser.add_argument("--workers", type=int, default=1,
                        help="--trainer ray: training workers (--batch-size is split among "
                        "them)")
    parser.add_argument("--gpu", action="store_true",
                        help="--trainer ray: one GPU per worker")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
