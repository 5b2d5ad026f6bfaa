"""A copy of the embedded model whose tokenizer holds a family's call markers as single tokens.

Kimi K2's `<|tool_calls_section_begin|>`, DeepSeek V3.1's `<｜tool▁calls▁begin｜>` and the like
are single tokens in those models' tokenizers, and vLLM's parsers for them look the markers up
in the vocabulary (a parser refuses a tokenizer without them). The embedded SmolLM2 writes them
as several pieces. This copy adds them as tokens (not special: DeepSeek's tokenizer holds
them so, and its vLLM parser reads them from text that skips special tokens). Forced calls
(the family's structural tag) make it write the family's format.

Built once per markers set under the pytest cache (a few seconds: load, resize, save); the
embedded model must be prepared (`ooo-spec models prepare`, which `make test` runs first).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from app.engine.embedded_model import embedded_model_dir


def marked_model_dir(markers: Sequence[str], root: Path) -> Path:
    """The embedded model with `markers` added as tokens, under `root` (reused when built)."""
    key = hashlib.sha256("\n".join(markers).encode()).hexdigest()[:12]
    target = root / f"embedded-marked-{key}"
    if (target / "config.json").is_file():
        return target
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    pieces = [tokenizer.encode(m, add_special_tokens=False) for m in markers]
    added = tokenizer.add_tokens([AddedToken(m, normalized=False) for m in markers])
    assert added == len(markers), f"some markers are tokens already: {markers}"
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    # Untied, so that reading a marker and writing it can differ: read as its pieces' mean,
    # written where the model would begin it: its logit a little above its first piece's, so
    # wherever that piece leads the marker is written whole, and nowhere else (xgrammar lets
    # any token into a JSON string value, special ones too: an eager marker fills them).
    model.config.tie_word_embeddings = False
    inputs = model.get_input_embeddings().weight
    model.lm_head.weight = torch.nn.Parameter(inputs.detach().clone())
    outputs = model.lm_head.weight
    with torch.no_grad():
        for marker, ids in zip(markers, pieces, strict=True):
            row = tokenizer.convert_tokens_to_ids(marker)
            inputs[row] = inputs[ids].mean(dim=0)
            outputs[row] = 1.05 * outputs[ids[0]]
    staging = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)  # whole or absent: another worker may be building the same
    return target
