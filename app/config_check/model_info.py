"""The model: its KV dimensions and context limit from its config.json when it is local (the
embedded model, a folder, the Hugging Face cache), else from `engine.model_dims`, else from
`KNOWN_MODELS`; and the `max_model_len` check against that limit."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import EngineConfig, ModelDims
from app.config_check.report import DeploymentReport

# Models a config may name without their config.json at hand.
KNOWN_MODELS: dict[str, ModelDims] = {
    "qwen/qwen3-0.6b": ModelDims(
        num_hidden_layers=28, num_key_value_heads=8, head_dim=128, num_parameters=0.6e9),
    "qwen/qwen3-1.7b": ModelDims(
        num_hidden_layers=28, num_key_value_heads=8, head_dim=128, num_parameters=1.7e9),
    "qwen/qwen3-4b": ModelDims(
        num_hidden_layers=36, num_key_value_heads=8, head_dim=128, num_parameters=4.0e9),
    "qwen/qwen3-8b": ModelDims(
        num_hidden_layers=36, num_key_value_heads=8, head_dim=128, num_parameters=8.2e9),
    "qwen/qwen3-14b": ModelDims(
        num_hidden_layers=40, num_key_value_heads=8, head_dim=128, num_parameters=14.8e9),
    "meta-llama/llama-3.1-8b": ModelDims(
        num_hidden_layers=32, num_key_value_heads=8, head_dim=128, num_parameters=8.03e9),
    "meta-llama/llama-3.1-8b-instruct": ModelDims(
        num_hidden_layers=32, num_key_value_heads=8, head_dim=128, num_parameters=8.03e9),
    "huggingfacetb/smollm2-135m": ModelDims(
        num_hidden_layers=30, num_key_value_heads=3, head_dim=64, num_parameters=1.35e8),
    "huggingfacetb/smollm2-135m-instruct": ModelDims(
        num_hidden_layers=30, num_key_value_heads=3, head_dim=64, num_parameters=1.35e8),
}
# Their context limit (config.json's max_position_embeddings; no RoPE scaling in these).
KNOWN_MAX_LEN: dict[str, int] = {
    "qwen/qwen3-0.6b": 40_960,
    "qwen/qwen3-1.7b": 40_960,
    "qwen/qwen3-4b": 40_960,
    "qwen/qwen3-8b": 40_960,
    "qwen/qwen3-14b": 40_960,
    "meta-llama/llama-3.1-8b": 131_072,
    "meta-llama/llama-3.1-8b-instruct": 131_072,
    "huggingfacetb/smollm2-135m": 8_192,
    "huggingfacetb/smollm2-135m-instruct": 8_192,
}
EMBEDDED_MODEL_ID = "huggingfacetb/smollm2-135m-instruct"


def local_config_json(model: str) -> Path | None:
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir, is_prepared

    if model == EMBEDDED_MODEL_ALIAS:
        folder = embedded_model_dir()
        return folder / "config.json" if is_prepared(folder) else None
    if (Path(model) / "config.json").is_file():
        return Path(model) / "config.json"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a repo id
        return None
    return Path(cached) if isinstance(cached, str) else None


def dims_from_config_json(config: Mapping[str, Any]) -> ModelDims:
    """KV dimensions and an estimate of the parameter count from a Hugging Face config."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = text
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    layers = int(config["num_hidden_layers"])
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    vocab = int(config.get("vocab_size") or 0)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * hidden * intermediate  # gate, up, down
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return ModelDims(
        num_hidden_layers=layers, num_key_value_heads=kv_heads, head_dim=head_dim,
        num_parameters=float(layers * (attention + mlp) + embeddings),
    )


def model_max_len(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """The longest `max_model_len` vLLM accepts for a model with this config.json, and the
    key it comes from (vLLM's `_get_and_verify_max_len`); None if it names no length."""
    text = config.get("text_config")
    text_config: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "model_max_length", "max_target_positions", "max_sequence_length",
            "max_seq_length", "seq_len")
    found = [(int(text_config[k]), k) for k in keys if text_config.get(k) is not None]
    if not found:
        return None
    length, key = min(found)
    if text_config.get("model_max_length"):
        length, key = int(text_config["model_max_length"]), "model_max_length"
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    model_type = str(config.get("model_type", ""))
    if isinstance(scaling, Mapping) and "gemma3" not in model_type:
        rope_type = scaling.get("rope_type") or scaling.get("type")
        # These types leave max_position_embeddings already scaled (or scale otherwise).
        unscaled = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
        factor = scaling.get("factor")
        if rope_type not in unscaled and isinstance(factor, (int, float)):
            return int(length * factor), f"{key} x rope_scaling.factor {factor}"
    return length, key


def raw_config_json(model: str) -> dict[str, Any] | None:
    path = local_config_json(model)
    if path is None:
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    return raw if isinstance(raw, dict) else None


def model_dims(cfg: EngineConfig) -> tuple[ModelDims, str, str | None] | None:
    """(dimensions, where they came from, the checkpoint's dtype if known), or None."""
    if cfg.model_dims is not None:
        return cfg.model_dims, "engine.model_dims", None
    path = local_config_json(cfg.model)
    if path is not None:
        raw = json.loads(path.read_text(encoding="utf-8"))
        dtype = raw.get("torch_dtype") or raw.get("dtype")
        return dims_from_config_json(raw), f"{path}", dtype if isinstance(dtype, str) else None
    key = EMBEDDED_MODEL_ID if cfg.model == "embedded" else cfg.model.lower()
    if key in KNOWN_MODELS:
        return KNOWN_MODELS[key], "table of known models", None
    return None


def check_max_model_len(dep: DeploymentReport, cfg: EngineConfig, setting: str) -> None:
    """vLLM refuses a `max_model_len` beyond the model's own (from its config.json when
    local, else the table of known models)."""
    raw = raw_config_json(cfg.model)
    limit: tuple[int, str] | None = None
    if raw is not None:
        limit = model_max_len(raw)
    else:
        key = EMBEDDED_MODEL_ID if cfg.model == "embedded" else cfg.model.lower()
        if key in KNOWN_MAX_LEN:
            limit = KNOWN_MAX_LEN[key], "max_position_embeddings (table of known models)"
    if limit is None:
        return
    dep.max_model_len_limit, dep.max_model_len_from = limit
    if cfg.max_model_len > limit[0]:
        dep.errors.append(
            f"`{setting}.max_model_len` = {cfg.max_model_len} is beyond the model's limit of "
            f"{limit[0]} tokens ({limit[1]}), which vLLM refuses: lower `{setting}.max_model_len`"
            f" to at most {limit[0]}"
        )
