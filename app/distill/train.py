"""A LoRA adapter on the sidecar model, trained on the pairs (PEFT, plain PyTorch loop).

Loss on the target tokens only (the prompt is what the sidecar is given, not what it writes).
The adapter sits on the top `layers` decoder layers (PEFT's `layers_to_transform`; vLLM serves
whatever layers an adapter has). The layers below are frozen and carry no adapter, so what they
make of a pair never changes: `trunk_states` runs them once per pair, and every training step
and agreement check runs only the top layers on those states (`_stack` runs a slice of the
model's own layers with its own forward). That is exact, not an approximation, and it is what
makes CPU training take minutes: a pair is a prompt of hundreds of tokens and a target of a
few, and the whole model's forward and backward at every step (30 layers instead of 8 on
SmolLM2-135M, and the LM head at every position) cost about 4x more.
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.distill.pairs import Pair

# The attention's input projections: vLLM packs the three into one `qkv_proj` per layer, and on
# CPU the sidecar's time grows with every layer vLLM wraps for LoRA, whatever its size (one
# packed qkv per layer on the top 8 costs ~8% per pass, every linear layer of them ~60%:
# app/engine/lora_modules.py). What a slot gets wrong is mostly which part of the question it
# copies, which is what attention decides.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj")
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
    layers: int | None = 8  # top decoder layers that carry the adapter; None: all of them
    modules: tuple[str, ...] = TARGET_MODULES  # the linear layers of each that carry it


def adapted_layers(total: int, layers: int | None) -> range:
    """Indices of the decoder layers that carry the adapter: the top `layers` of `total`."""
    if layers is None or layers >= total:
        return range(total)
    if layers < 1:
        raise ValueError(f"layers: at least 1, got {layers}")
    return range(total - layers, total)


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of step `step`'s batch: epochs of a seeded shuffle of range(n), one batch after
    the other (the last batch of an epoch may be short)."""
    per_epoch = -(-n // batch_size)
    epoch, index = divmod(step, per_epoch)
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order[index * batch_size:(index + 1) * batch_size]


def collate(pairs: Sequence[Pair], pad_id: int) -> dict[str, Any]:
    """Right-padded input ids (prompt + target) and their attention mask."""
    import torch

    size = max(len(p.prompt_ids) + len(p.target_ids) for p in pairs)
    ids, mask = [], []
    for p in pairs:
        row = p.prompt_ids + p.target_ids
        pad = size - len(row)
        ids.append(row + [pad_id] * pad)
        mask.append([1] * len(row) + [0] * pad)
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def load_model(model_path: str, settings: TrainSettings) -> Any:
    """The sidecar model in float32 with a fresh, seeded LoRA adapter on its top layers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(settings.seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    layers = adapted_layers(base.config.num_hidden_layers, settings.layers)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                        target_modules=list(settings.modules), task_type="CAUSAL_LM",
                        layers_to_transform=list(layers), layers_pattern="layers")
    return get_peft_model(base, config)


def _first_adapted(model: Any) -> int:
    """The first layer with the adapter: where the frozen trunk ends."""
    layers = model.peft_config["default"].layers_to_transform
    return min(layers) if layers else 0


@contextmanager
def _stack(model: Any, start: int, top: bool) -> Iterator[Any]:
    """The model's decoder (HF `model.model`: Llama, Qwen, Mistral...) with only its layers
    from `start` on (`top`, then its final norm) or only those below `start` (no final norm:
    what they hand to layer `start`), for the length of the block."""
    import torch

    decoder = model.get_base_model().model
    layers, norm = decoder.layers, decoder.norm
    decoder.layers = torch.nn.ModuleList(list(layers)[start:] if top else list(layers)[:start])
    if not top:
        decoder.norm = torch.nn.Identity()
    try:
        yield decoder
    finally:
        decoder.layers, decoder.norm = layers, norm


def trunk_states(model: Any, pairs: Sequence[Pair], pad_id: int, batch_size: int = 8,
                 progress: bool = False, what: str = "pairs") -> list[Any]:
    """Per pair, the hidden states (one row per token of prompt + target) that the frozen
    layers below the adapter hand to the first adapted layer."""
    import torch
    from tqdm import tqdm

    start = _first_adapted(model)
    device = next(model.parameters()).device
    states: list[Any] = []
    # A pass over thousands of pairs takes minutes on CPU before the first step.
    bar = tqdm(total=len(pairs), desc=f"frozen layers ({what})", unit="pair",
               disable=not progress)
    with torch.no_grad(), _stack(model, start, top=False) as decoder:
        for first in range(0, len(pairs), batch_size):
            chunk = pairs[first:first + batch_size]
            batch = collate(chunk, pad_id)
            hidden = decoder(input_ids=batch["input_ids"].to(device),
                             attention_mask=batch["attention_mask"].to(device)).last_hidden_state
            states.extend(hidden[i, :len(p.prompt_ids) + len(p.target_ids)].clone()
                          for i, p in enumerate(chunk))
            bar.update(len(chunk))
    bar.close()
    return states


def target_logits(model: Any, pairs: Sequence[Pair], states: Sequence[Any]) -> tuple[Any, Any]:
    """The top layers on the pairs' trunk states: the logits at every position that predicts a
    target token (position i - 1 predicts token i), and those target tokens."""
    import torch

    size = max(len(s) for s in states)
    device = states[0].device
    padded = torch.zeros(len(states), size, states[0].shape[-1], device=device)
    mask = torch.zeros(len(states), size, dtype=torch.long, device=device)
    rows: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    for i, (p, s) in enumerate(zip(pairs, states, strict=True)):
        padded[i, :len(s)] = s
        mask[i, :len(s)] = 1
        rows.extend([i] * len(p.target_ids))
        positions.extend(range(len(p.prompt_ids) - 1, len(p.prompt_ids) + len(p.target_ids) - 1))
        targets.extend(p.target_ids)
    with _stack(model, _first_adapted(model), top=True) as decoder:
        hidden = decoder(inputs_embeds=padded, attention_mask=mask).last_hidden_state
    at = (torch.tensor(rows, device=device), torch.tensor(positions, device=device))
    logits = model.get_base_model().lm_head(hidden[at])
    return logits, torch.tensor(targets, device=device)


def allowed_tokens(choices: Sequence[Sequence[int]], target: Sequence[int], position: int
                   ) -> list[int]:
    """The tokens the names' grammar allows at `position` of `target`: the next token of
    every choice that agrees with the target so far."""
    return sorted({c[position] for c in choices
                   if len(c) > position and list(c[:position]) == list(target[:position])})


def batch_loss(model: Any, pairs: Sequence[Pair], states: Sequence[Any],
               chosen: Sequence[int]) -> Any:
    """The cross-entropy of the top layers on the target tokens of pairs `chosen`."""
    import torch

    logits, targets = target_logits(model, [pairs[i] for i in chosen],
                                    [states[i] for i in chosen])
    return torch.nn.functional.cross_entropy(logits, targets)


def _agrees(pair: Pair, logits: Any) -> bool:
    """`logits`: one row per target token of `pair`."""
    for j, token in enumerate(pair.target_ids):
        allowed = allowed_tokens(pair.choices, pair.target_ids, j) if pair.choices else []
        best = allowed[int(logits[j, allowed].argmax())] if allowed else int(logits[j].argmax())
        if best != token:
            return False
    return True


def greedy_agrees(model: Any, pairs: Sequence[Pair], states: Sequence[Any],
                  batch_size: int = 8) -> list[bool]:
    """Per pair: the model's argmax at every target position is the target token; for a
    `name` pair, the argmax among the tokens the names' grammar allows there (what
    `SidecarService.choose` generates, on the names' own tokenization)."""
    import torch

    out: list[bool] = []
    model.eval()
    with torch.no_grad():
        for first in range(0, len(pairs), batch_size):
            chunk = pairs[first:first + batch_size]
            logits, _ = target_logits(model, chunk, states[first:first + batch_size])
            row = 0
            for p in chunk:
                out.append(_agrees(p, logits[row:row + len(p.target_ids)]))
                row += len(p.target_ids)
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
    states: Sequence[Any],
    out: Path,
    settings: TrainSettings,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> float | None:
    """Train `model` (a PEFT model from `load_model`) in place for `settings.steps` steps on
    the pairs and their `trunk_states`, resuming from `out/checkpoint` when it is there; saves
    the adapter to `out/adapter`. The last loss."""
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
        chosen = batch_indices(len(pairs), settings.batch_size, step, settings.seed)
        loss = batch_loss(model, pairs, states, chosen)
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
    portable_adapter(out / ADAPTER)
    return loss_value


def portable_adapter(folder: Path) -> None:
    """The adapter without this machine's paths: PEFT records the base model's folder
    (`base_model_name_or_path`, and in the model card it writes beside): the folder's name is
    kept, the card dropped. Neither vLLM nor PEFT reads them to load the adapter."""
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if base:
        config["base_model_name_or_path"] = Path(base).name
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "README.md").unlink(missing_ok=True)
