"""A LoRA adapter on the sidecar model, trained on the pairs (PEFT, plain PyTorch loop).

Loss on the target tokens only (the prompt is what the sidecar is given, not what it writes).
Deterministic for a seed: the batch order of step `s` is a function of (seed, s) alone
(`batch_indices`), the adapter's initial weights come from the seeded generator, there is no
dropout and the learning rate is constant, so a run resumed from a checkpoint takes the same
steps as one that never stopped. Every `checkpoint_every` steps the adapter, the optimizer and
the step are written to `<out>/checkpoint/` (replaced atomically); a new run with the same
`out` picks up from there. The finished adapter goes to `<out>/adapter/` in PEFT's format
(adapter_config.json + adapter_model.safetensors), which vLLM's LoRA loader reads.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.distill.pairs import Pair

# Every linear layer of a Llama block: vLLM's LoRA serves all of them.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IGNORE = -100  # label of a position without loss (the prompt, padding)
CHECKPOINT = "checkpoint"
ADAPTER = "adapter"


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 300
    batch_size: int = 8
    learning_rate: float = 5e-4
    rank: int = 16
    alpha: int = 32
    seed: int = 0
    checkpoint_every: int = 50


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of step `step`'s batch: epochs of a seeded shuffle of range(n), one batch after
    the other (the last batch of an epoch may be short)."""
    per_epoch = -(-n // batch_size)
    epoch, index = divmod(step, per_epoch)
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order[index * batch_size:(index + 1) * batch_size]


def collate(pairs: Sequence[Pair], pad_id: int) -> dict[str, Any]:
    """Right-padded input ids, attention mask and labels (the target tokens only)."""
    import torch

    size = max(len(p.prompt_ids) + len(p.target_ids) for p in pairs)
    ids, mask, labels = [], [], []
    for p in pairs:
        row = p.prompt_ids + p.target_ids
        pad = size - len(row)
        ids.append(row + [pad_id] * pad)
        mask.append([1] * len(row) + [0] * pad)
        labels.append([IGNORE] * len(p.prompt_ids) + p.target_ids + [IGNORE] * pad)
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
            "labels": torch.tensor(labels)}


def load_model(model_path: str, settings: TrainSettings) -> Any:
    """The sidecar model in float32 with a fresh, seeded LoRA adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(settings.seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                        target_modules=list(TARGET_MODULES), task_type="CAUSAL_LM")
    return get_peft_model(base, config)


def greedy_agrees(model: Any, pairs: Sequence[Pair], pad_id: int, batch_size: int = 8
                  ) -> list[bool]:
    """Per pair: the model's argmax at every target position is the target token."""
    import torch

    out: list[bool] = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            batch = collate(chunk, pad_id)
            logits = model(input_ids=batch["input_ids"],
                           attention_mask=batch["attention_mask"]).logits
            # The token at position i is predicted by the logits at i - 1.
            predicted = logits[:, :-1].argmax(-1)
            labels = batch["labels"][:, 1:]
            scored = labels != IGNORE
            right = (predicted == labels) | ~scored
            out.extend(bool(r) for r in right.all(-1))
    return out


def _save_checkpoint(model: Any, optimizer: Any, step: int, loss: float | None,
                     folder: Path) -> None:
    import torch

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "loss": loss}))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _load_checkpoint(model: Any, optimizer: Any, folder: Path) -> tuple[int, float | None]:
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt"))
    state = json.loads((folder / "state.json").read_text())
    return int(state["step"]), state.get("loss")


def train(
    model: Any,
    pairs: Sequence[Pair],
    pad_id: int,
    out: Path,
    settings: TrainSettings,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> float | None:
    """Train `model` (a PEFT model) in place for `settings.steps` steps, resuming from
    `out/checkpoint` when it is there; saves the adapter to `out/adapter`. The last loss."""
    import torch
    from tqdm import tqdm

    if not pairs:
        raise ValueError("no training pairs")
    out.mkdir(parents=True, exist_ok=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=0.0)
    step, loss_value = 0, None
    checkpoint = out / CHECKPOINT
    if (checkpoint / "state.json").is_file():
        step, loss_value = _load_checkpoint(model, optimizer, checkpoint)
    (out / "settings.json").write_text(json.dumps(asdict(settings), indent=2))
    model.train()
    bar = tqdm(total=settings.steps, initial=step, desc="training", unit="step",
               disable=not progress)
    while step < settings.steps:
        chunk = [pairs[i] for i in batch_indices(len(pairs), settings.batch_size, step,
                                                 settings.seed)]
        loss = model(**collate(chunk, pad_id)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        loss_value = float(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}")
        if on_step is not None:
            on_step(step, loss_value)
        if step % settings.checkpoint_every == 0 or step == settings.steps:
            _save_checkpoint(model, optimizer, step, loss_value, checkpoint)
    bar.close()
    model.save_pretrained(out / ADAPTER)
    return loss_value


def run_training(
    model_path: str, train_pairs: Sequence[Pair], held_out: Sequence[Pair], out: Path,
    settings: TrainSettings, progress: bool = True,
) -> Any:
    """Load, measure the held-out agreement without the adapter, train, measure again; writes
    and returns the `TrainingReport`."""
    from transformers import AutoTokenizer

    from app.distill.report import TrainingReport, agreement, report_json

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model = load_model(model_path, settings)
    with model.disable_adapter():
        before = agreement(held_out, greedy_agrees(model, held_out, pad_id))
    started = time.perf_counter()
    loss = train(model, train_pairs, pad_id, out, settings, progress)
    seconds = time.perf_counter() - started
    after = agreement(held_out, greedy_agrees(model, held_out, pad_id))
    report = TrainingReport(seed=settings.seed, steps=settings.steps,
                            train_pairs=len(train_pairs), held_out_pairs=len(held_out),
                            final_loss=loss, train_seconds=seconds, before=before, after=after)
    (out / "report.json").write_text(report_json(report))
    return report
