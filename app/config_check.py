"""`ooo-spec config check`: will this Serve config start? Answered before anything is deployed.

For every application of a Ray Serve config file (or of a RayService manifest's
`serveConfigV2`), the `args` are validated with `AppConfig`, and for every deployment this says
where it runs (actor options), which engine arguments and environment its vLLM engine gets
(`app/engine/engine_args.py`, the functions the replica itself calls) and whether the KV cache
holds one request of `max_model_len` tokens, which vLLM requires before it serves anything.

KV cache per token, as vLLM sizes a full-attention layer (`v1/kv_cache_interface.py`):
2 (K and V) x layers x KV heads x head_dim x dtype bytes, in blocks of `block_size` tokens plus
the one null block the block pool holds back (`v1/core/kv_cache_utils.py`). The model's
dimensions come from its config.json when it is local (the embedded model, a folder, the
Hugging Face cache), else from `engine.model_dims`, else from `KNOWN_MODELS`. On a GPU the
memory comes from `engine.gpu_type` (or the deployment's `accelerator_type`) via `GPU_MEMORY_MIB`.
What the cache gets on a GPU without `kv_cache_gib` is an estimate: vLLM measures activations
and CUDA graphs at start, this check reserves `GPU_RESERVE_GIB` for them.

What else fails at start, checked here as vLLM checks it: a dtype the GPU cannot run (bf16
below compute capability 8.0, `CudaPlatform.check_if_supports_dtype`), a `max_model_len` beyond
the model's own limit (`_get_and_verify_max_len`: the smallest of its length keys, times the
RoPE scaling factor for the RoPE types that do not already count it), weights absent while
`HF_HUB_OFFLINE=1` (the pods' setting), and a tensor-parallel engine whose replica does not hold
its GPUs on one node (app/engine/placement.py) or whose worker group's pods have fewer GPUs
(read from a RayService manifest's `rayClusterConfig`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from app.config import (
    MAIN_SUFFIX,
    ROUTER,
    ROUTER_MAX_ONGOING_REQUESTS,
    AppConfig,
    EngineConfig,
    ModelDims,
    Platform,
    SidecarUserConfig,
)
from app.engine.engine_args import (
    DEFAULT_BLOCK_SIZE,
    cpu_kv_cache_gib,
    custom_proposer_config,
    engine_launch,
)
from app.engine.placement import Placement, engine_placement, placement_problems
from app.engine.vllm_suffix import SUFFIX_MISSING, suffix_available

GIB = 1 << 30

# The keys of Serve's `ray_actor_options` that place a replica.
_ACTOR_KEYS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type")
# Where a deployment without a `deployments:` entry takes its actor options from.
CODE_DEFAULT = "code default (deployments/app.py)"


class ActorOptions(BaseModel):
    """The part of a deployment's Serve `ray_actor_options` that decides where it runs."""

    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    memory: int | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    accelerator_type: str | None = None


# Total memory per GPU as the driver reports it (nvidia-smi), by Ray's accelerator type names.
GPU_MEMORY_MIB: dict[str, int] = {
    "T4": 15_360,
    "V100": 16_384,
    "A10": 23_028,
    "A10G": 23_028,
    "L4": 23_034,
    "L40": 46_068,
    "L40S": 46_068,
    "A100": 40_960,  # the 40 GB part; name the 80 GB one "A100-80G"
    "A100-40G": 40_960,
    "A100-80G": 81_920,
    "H100": 81_559,
    "H20": 97_871,
    "H200": 143_771,
    "B200": 183_359,
}
# Compute capability by the same names (NVIDIA's CUDA GPUs table): bf16 needs 8.0 (Ampere).
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "T4": (7, 5),
    "V100": (7, 0),
    "A10": (8, 6),
    "A10G": (8, 6),
    "L4": (8, 9),
    "L40": (8, 9),
    "L40S": (8, 9),
    "A100": (8, 0),
    "A100-40G": (8, 0),
    "A100-80G": (8, 0),
    "H100": (9, 0),
    "H20": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
}
BF16_MIN_CAPABILITY = (8, 0)
# Activations of the profiling run, CUDA graphs and memory outside torch, which vLLM measures
# at start and takes out of `gpu_memory_utilization` before the KV cache: an estimate.
GPU_RESERVE_GIB = 2.5

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
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class ConfigCheckError(Exception):
    """The file cannot be read as a Serve config at all."""


# ---------------------------------------------------------------- reading the file


def serve_configs(text: str, source: str) -> list[dict[str, Any]]:
    """The Serve config(s) in a file: a Serve config itself, or a RayService manifest (or a
    kustomize patch of one) whose `spec.serveConfigV2` holds one as text."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigCheckError(f"{source}: not YAML: {exc}") from None
    found: list[dict[str, Any]] = []
    for doc in documents:
        if not isinstance(doc, dict):
            continue
        if "applications" in doc:
            found.append(doc)
        elif doc.get("kind") == "RayService":
            spec = doc.get("spec") or {}
            inner = spec.get("serveConfigV2")
            if isinstance(inner, str):
                pools = pool_gpus(spec.get("rayClusterConfig") or {})
                for config in serve_configs(inner, f"{source} (serveConfigV2)"):
                    found.append({**config, POOL_GPUS_KEY: pools} if pools else config)
    if not found:
        raise ConfigCheckError(
            f"{source}: no Serve config (`applications:`) and no RayService serveConfigV2"
        )
    return found


# Where `serve_configs` puts the GPUs per pod of a RayService's worker groups, by the custom
# pool resource each group offers (not a Serve key: no Serve config can carry it).
POOL_GPUS_KEY = "__pool_gpus__"


def pool_gpus(cluster: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """{pool resource: (worker group, GPUs per pod)} of a RayService's `rayClusterConfig`:
    a deployment pinned to a pool runs on that group's pods (k8s/README.md, "Pools")."""
    out: dict[str, tuple[str, int]] = {}
    for group in cluster.get("workerGroupSpecs") or []:
        if not isinstance(group, Mapping):
            continue
        containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or []
        limits = ((containers[0].get("resources") or {}).get("limits") or {}) if containers else {}
        gpus = int(limits.get("nvidia.com/gpu", 0) or 0)
        for resource in group.get("resources") or {}:
            out[str(resource)] = (str(group.get("groupName")), gpus)
    return out


# ---------------------------------------------------------------- where each deployment runs


def deployment_actor_options(
    application: Mapping[str, Any], config: AppConfig
) -> dict[str, tuple[ActorOptions, str]]:
    """Actor options of every deployment the application has, by Serve deployment name, with
    where they were read: the Serve config's `deployments:` entry of that name when it sets
    `ray_actor_options` (Serve applies those over the code's), else the code's default (one
    CPU, no GPU: GPU deployments must say so in their entries)."""
    entries: dict[str, Mapping[str, Any]] = {}
    for entry in application.get("deployments") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            entries[entry["name"]] = entry
    out: dict[str, tuple[ActorOptions, str]] = {}
    for name in config.deployment_names():
        raw = (entries.get(name) or {}).get("ray_actor_options")
        if isinstance(raw, Mapping):
            picked = {k: raw[k] for k in _ACTOR_KEYS if k in raw and raw[k] is not None}
            out[name] = (
                ActorOptions.model_validate(picked),
                f"deployments[{name}].ray_actor_options",
            )
        else:
            out[name] = (ActorOptions(), CODE_DEFAULT)
    return out


# ---------------------------------------------------------------- model dimensions


def _local_config_json(model: str) -> Path | None:
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


def _raw_config_json(model: str) -> dict[str, Any] | None:
    path = _local_config_json(model)
    if path is None:
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    return raw if isinstance(raw, dict) else None


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` as huggingface_hub reads it (the pods set it: k8s/base/runtime.yaml)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _has_weights(folder: Path) -> bool:
    return folder.is_dir() and any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir())


def missing_weights(model: str, setting: str) -> str | None:
    """Why an engine of `model` would find no weights with the hub offline, naming the
    setting; None when they are there (the embedded model prepared, a folder with weights, or
    the model's snapshot in the Hugging Face cache)."""
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir, is_prepared

    if model == EMBEDDED_MODEL_ALIAS:
        if is_prepared(embedded_model_dir()):
            return None
        return (f"`{setting}.model` is the embedded model, which is not prepared here: run "
                "`ooo-spec models prepare`")
    if Path(model).is_dir():
        if _has_weights(Path(model)):
            return None
        return f"`{setting}.model` = {model!r} is a folder without weights"
    cached = _local_config_json(model)
    if cached is not None and _has_weights(cached.parent):
        return None
    return (
        f"`{setting}.model` = {model!r} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 "
        f"forbids downloading it: prefetch it (`hf download {model}`, or build the image with "
        f"PREFETCH_MODELS naming it), or set `{setting}.model` to a folder holding it"
    )


def model_dims(cfg: EngineConfig) -> tuple[ModelDims, str, str | None] | None:
    """(dimensions, where they came from, the checkpoint's dtype if known), or None."""
    if cfg.model_dims is not None:
        return cfg.model_dims, "engine.model_dims", None
    path = _local_config_json(cfg.model)
    if path is not None:
        raw = json.loads(path.read_text(encoding="utf-8"))
        dtype = raw.get("torch_dtype") or raw.get("dtype")
        return dims_from_config_json(raw), f"{path}", dtype if isinstance(dtype, str) else None
    key = EMBEDDED_MODEL_ID if cfg.model == "embedded" else cfg.model.lower()
    if key in KNOWN_MODELS:
        return KNOWN_MODELS[key], "table of known models", None
    return None


def kv_bytes_per_token(dims: ModelDims, dtype_bytes: int) -> int:
    return 2 * dims.num_hidden_layers * dims.num_key_value_heads * dims.head_dim * dtype_bytes


def kv_bytes_for_request(per_token: int, max_model_len: int, block_size: int) -> int:
    """What vLLM requires before it starts: the blocks of one `max_model_len` request, plus
    the null block the block pool holds back."""
    return (math.ceil(max_model_len / block_size) + 1) * block_size * per_token


# ---------------------------------------------------------------- the report


class KvCacheReport(BaseModel):
    bytes_per_token: int
    block_size: int
    request_gib: float = Field(description="One request of max_model_len tokens.")
    cache_gib: float
    cache_from: str
    fits: bool
    full_length_requests: float = Field(description="How many max_model_len requests fit.")


class DeploymentReport(BaseModel):
    name: str
    actor: dict[str, Any]
    actor_from: str
    platform: Platform | None = None  # None: no vLLM engine
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None
    model: str | None = None
    model_dims: dict[str, Any] | None = None
    model_dims_from: str | None = None
    engine_args: dict[str, Any] | None = None
    # vLLM's `speculative_config` of the engine (also in engine_args), shown on its own.
    speculative_config: dict[str, Any] | None = None
    tensor_parallel_size: int | None = None
    # The Serve placement a tensor-parallel engine needs (app/engine/placement.py).
    placement: Placement | None = None
    max_model_len_limit: int | None = None
    max_model_len_from: str | None = None
    env: dict[str, str] | None = None
    env_unset: list[str] = Field(default_factory=list)
    kv_cache: KvCacheReport | None = None
    # The main model: its tool format, how its prompt is built, and a warning when its chat
    # template writes calls in another dialect (None: the tokenizer is not local).
    tool_format: str | None = None
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class ApplicationReport(BaseModel):
    name: str
    deployments: list[DeploymentReport] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class ConfigReport(BaseModel):
    source: str
    applications: list[ApplicationReport] = Field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        out: list[str] = []
        for app in self.applications:
            out += [f"{app.name}: {e}" for e in app.errors]
            for dep in app.deployments:
                out += [f"{app.name}/{dep.name}: {e}" for e in dep.errors]
        return out

    @property
    def ok(self) -> bool:
        return not self.errors


def check_file(path: str | Path) -> ConfigReport:
    text = Path(path).read_text(encoding="utf-8")
    return check_text(text, str(path))


def check_text(text: str, source: str) -> ConfigReport:
    report = ConfigReport(source=source)
    for serve_config in serve_configs(text, source):
        for index, application in enumerate(serve_config.get("applications") or []):
            report.applications.append(
                check_application(application, index, serve_config.get(POOL_GPUS_KEY))
            )
    return report


def _validation_messages(exc: ValidationError) -> list[str]:
    return [
        f"args.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
        for e in exc.errors()
    ]


def check_application(
    application: Mapping[str, Any],
    index: int = 0,
    pools: Mapping[str, tuple[str, int]] | None = None,
) -> ApplicationReport:
    """One application's report; `pools`: the GPUs per pod of the worker groups, by the pool
    resource each offers, when the config came from a RayService manifest."""
    report = ApplicationReport(name=str(application.get("name") or f"applications[{index}]"))
    try:
        config = AppConfig.model_validate(application.get("args") or {})
    except ValidationError as exc:
        report.errors += _validation_messages(exc)
        return report
    actors = deployment_actor_options(application, config)
    report.errors += router_capacity_errors(application, config)
    engines: dict[str, tuple[EngineConfig, str, dict[str, Any] | None]] = {
        "MainModel": (config.main.engine, "main.engine",
                      custom_proposer_config(config.speculation)),
    }
    if config.sidecar.enabled:
        # The sidecar's engine drafts the verifying pass over a call from its slots: it gets
        # the candidate proposer too (app/sidecar/service.py).
        engines["Sidecar"] = (config.sidecar.engine, "sidecar.engine",
                              custom_proposer_config(config.speculation))
    ngram = config.baselines.ngram
    if ngram.enabled:
        engines["MainModelNgram"] = (
            ngram.engine or config.main.engine,
            "baselines.ngram.engine" if ngram.engine else "main.engine",
            ngram.speculative_config(),
        )
    suffix = config.baselines.suffix
    if suffix.enabled:
        engines[MAIN_SUFFIX] = (
            suffix.engine or config.main.engine,
            "baselines.suffix.engine" if suffix.engine else "main.engine",
            suffix.speculative_config(),
        )
    pools = pools or {}
    for name, (actor, actor_from) in actors.items():
        dep = DeploymentReport(
            name=name, actor=actor.model_dump(exclude_none=True), actor_from=actor_from
        )
        if name in engines:
            cfg, setting, speculative = engines[name]
            check_engine(dep, actor, cfg, setting, speculative)
            check_parallel(dep, actor, cfg, setting, _entry(application, name), pools)
        if name == "MainModel":
            check_tool_format(dep, config.main.engine)
        if name == "Sidecar":
            dep.errors += sidecar_adapter_errors(config, _user_config(application, name))
        if name == MAIN_SUFFIX and not suffix_available():
            # A warning, not an error: the config may be checked away from the image it runs in.
            dep.warnings.append(SUFFIX_MISSING)
        report.deployments.append(dep)
    _check_baseline_hardware(report, actors)
    return report


def router_capacity_errors(application: Mapping[str, Any], config: AppConfig) -> list[str]:
    """`auth.max_concurrent_anonymous` above what the Router deployment holds at once (its
    entry's `max_ongoing_requests`, else the code's default): past the router's capacity Serve
    queues requests where no limit answers them. The router clamps it at start; said here."""
    raw = _entry(application, ROUTER).get("max_ongoing_requests")
    capacity = raw if isinstance(raw, int) and raw > 0 else ROUTER_MAX_ONGOING_REQUESTS
    anonymous = config.auth.max_concurrent_anonymous
    if anonymous is None or anonymous <= capacity:
        return []
    return [f"args.auth.max_concurrent_anonymous is {anonymous}, above the Router deployment's "
            f"max_ongoing_requests ({capacity}): lower it (or unset it to use that number); "
            "the router would clamp it to that"]


def _entry(application: Mapping[str, Any], deployment: str) -> Mapping[str, Any]:
    for entry in application.get("deployments") or []:
        if isinstance(entry, Mapping) and entry.get("name") == deployment:
            return entry
    return {}


def _user_config(application: Mapping[str, Any], deployment: str) -> Any:
    return _entry(application, deployment).get("user_config")


def check_parallel(
    dep: DeploymentReport,
    actor: ActorOptions,
    cfg: EngineConfig,
    setting: str,
    entry: Mapping[str, Any],
    pools: Mapping[str, tuple[str, int]],
) -> None:
    """A tensor-parallel engine: its replica holds all its GPUs on one node (the placement
    app/engine/placement.py derives, shown in the report), and the worker group its pool
    resource pins it to has that many GPUs per pod."""
    tp = cfg.tensor_parallel_size
    dep.tensor_parallel_size = tp
    where = f"deployments[{dep.name}]"
    options = actor.model_dump(exclude_none=True)
    dep.placement = engine_placement(tp, options)
    raw = _raw_config_json(cfg.model) if tp > 1 else None
    text = (raw or {}).get("text_config") or raw or {}
    heads = text.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        # vLLM: "Total number of attention heads (9) must be divisible by tensor parallel size".
        dep.errors.append(
            f"`{setting}.tensor_parallel_size` = {tp} does not divide the model's {heads} "
            f"attention heads, which vLLM refuses: set it to a divisor of {heads}"
        )
    if tp > 1 and dep.platform != "cuda":
        dep.errors.append(
            f"`{setting}.tensor_parallel_size` = {tp} needs GPUs: give {where} "
            f"`ray_actor_options.num_gpus: {tp}`, or set `{setting}.tensor_parallel_size` to 1"
        )
        return
    for problem in placement_problems(
        tp, options, entry.get("placement_group_bundles"), entry.get("placement_group_strategy")
    ):
        dep.errors.append(f"`{setting}.tensor_parallel_size` = {tp}: in {where}, {problem}")
    needed = max(tp if tp > 1 else 0, math.ceil(actor.num_gpus))
    for resource in actor.resources:
        if resource in pools and pools[resource][1] < needed:
            group, gpus = pools[resource]
            fix = (f"lower `{setting}.tensor_parallel_size`" if tp > 1
                   else f"lower {where} `ray_actor_options.num_gpus`")
            dep.errors.append(
                f"the engine needs {needed} GPUs on one node (`{setting}.tensor_parallel_size` "
                f"= {tp}), but worker group {group!r}, which offers {resource}, has {gpus} per "
                f"pod: raise its pods' nvidia.com/gpu to {needed}, or {fix}"
            )


def sidecar_adapter_errors(config: AppConfig, user_config: Any) -> list[str]:
    """`sidecar.lora` and the adapter a Sidecar `user_config` swaps in (`lora_path`): each
    must be there, within `max_rank`, and a swap needs the engine built with LoRA."""
    lora = config.sidecar.lora
    errors = lora.errors() if lora is not None else []
    if user_config is None:
        return errors
    try:
        update = SidecarUserConfig.model_validate(user_config)
    except ValidationError as exc:
        return errors + [f"Sidecar user_config: {e['msg']}" for e in exc.errors()]
    if update.lora_path is None:
        return errors
    if lora is None:
        return errors + ["Sidecar user_config.lora_path: set sidecar.lora in args too (the "
                         "sidecar's engine is built with LoRA only then)"]
    swapped = lora.model_copy(update={"path": update.lora_path})
    errors += [f"Sidecar user_config: {e}" for e in swapped.errors()]
    if errors or lora.modules == "all":
        return errors
    from app.engine.lora_modules import peft_modules

    configured, swapping = peft_modules(lora.path), peft_modules(swapped.path)
    if configured is None or swapping is None:
        return errors  # weights in another format: the replica checks what vLLM wraps
    extra = sorted(swapping - configured)
    if extra:
        errors.append(
            f"Sidecar user_config.lora_path: the adapter has layers sidecar.lora.path's does not "
            f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), and the engine wraps "
            "only those for LoRA: set sidecar.lora.modules: all, or deploy it as sidecar.lora.path"
        )
    return errors


# Model families that think before they answer, by a piece of their name, and the parser
# vLLM reads their thoughts with.
THINKING_MODELS = {"qwen3": "qwen3", "deepseek-r1": "deepseek_r1"}


def check_tool_format(dep: DeploymentReport, cfg: EngineConfig) -> None:
    """How the main model's prompt is built with tools, and whether its chat template agrees
    with `main.engine.tool_format` (only for a model whose tokenizer is on this machine); a
    thinking model without `reasoning_parser` is warned about (its thoughts would be content)."""
    for piece, parser in THINKING_MODELS.items():
        if piece in cfg.model.lower() and cfg.reasoning_parser is None:
            dep.warnings.append(
                f"{cfg.model} thinks before it answers: set `main.engine.reasoning_parser: "
                f"{parser}`, or its thoughts come back as content and are drafted over"
            )
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir, is_prepared
    from app.formats import chat_prompt
    from app.formats.tool_formats import get_format

    if cfg.model == EMBEDDED_MODEL_ALIAS:
        folder: Path | None = embedded_model_dir() if is_prepared() else None
    else:
        folder = Path(cfg.model) if (Path(cfg.model) / "tokenizer_config.json").is_file() else None
    if folder is None:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    fmt = get_format(cfg.tool_format)
    native = chat_prompt.template_renders_tools(tokenizer)
    dep.tool_format = f"{fmt.name}; " + (
        "the chat template renders tools" if native
        else "the template ignores tools: the format's own tool prompt")
    mismatch = chat_prompt.format_mismatch(tokenizer, fmt)
    if mismatch:
        dep.warnings.append(mismatch)


def _check_baseline_hardware(
    report: ApplicationReport, actors: Mapping[str, tuple[ActorOptions, str]]
) -> None:
    """A baseline engine is compared with the main model: it must run on the same hardware,
    its own GPU when the main model has one."""
    main, _ = actors["MainModel"]
    for name, label in (("MainModelNgram", "n-gram"), (MAIN_SUFFIX, "suffix")):
        if name not in actors:
            continue
        peer, peer_from = actors[name]
        if main.num_gpus != peer.num_gpus:
            dep = next(d for d in report.deployments if d.name == name)
            dep.errors.append(
                f"the {label} baseline reserves {peer.num_gpus} GPUs, the main model "
                f"{main.num_gpus}: set `{peer_from}.num_gpus` to {main.num_gpus} so it runs on "
                "a GPU of its own, like the model it is compared with"
            )


def _platform(actor: ActorOptions) -> Platform:
    # A replica that reserved GPUs runs on CUDA. One that reserved none is placed (pool
    # resources) on CPU nodes, where NVML, which decides the platform like vLLM
    # (cuda_driver.detect_platform), sees no GPU; on a GPU node it would take CUDA with no
    # device visible to it, so engine deployments there reserve their GPUs.
    return "cuda" if actor.num_gpus > 0 else "cpu"


def _model_path_for_display(model: str) -> str:
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir

    return str(embedded_model_dir()) if model == EMBEDDED_MODEL_ALIAS else model


def check_engine(
    dep: DeploymentReport,
    actor: ActorOptions,
    cfg: EngineConfig,
    setting: str,
    speculative: dict[str, Any] | None,
) -> None:
    """Fill `dep` with the engine's arguments and environment and the KV cache check."""
    platform = _platform(actor)
    dep.platform = platform
    dep.model = cfg.model
    launch = engine_launch(platform, cfg, _model_path_for_display(cfg.model), speculative)
    dep.engine_args = launch.kwargs
    dep.speculative_config = launch.kwargs.get("speculative_config")
    dep.env = launch.effective_env({})
    dep.env_unset = list(launch.env_unset)
    if hub_offline():
        missing = missing_weights(cfg.model, setting)
        if missing is not None:
            dep.errors.append(missing)
    check_max_model_len(dep, cfg, setting)
    if cfg.batch_invariant and platform != "cuda":
        dep.errors.append(
            f"`{setting}.batch_invariant` is vLLM's CUDA mode; on CPU a float32 engine's output "
            f"is already identical to plain decoding's: set `{setting}.batch_invariant` to false"
        )
    found = model_dims(cfg)
    if found is None:
        dep.errors.append(
            f"unknown model {cfg.model!r}: its config.json is not local and it is not in the "
            f"table of known models; set `{setting}.model_dims`"
        )
        return
    dims, dims_from, checkpoint_dtype = found
    dep.model_dims, dep.model_dims_from = dims.model_dump(), dims_from
    dtype = cfg.dtype if cfg.dtype != "auto" else (checkpoint_dtype or "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    per_token = kv_bytes_per_token(dims, dtype_bytes)
    block = cfg.block_size or DEFAULT_BLOCK_SIZE[platform]
    needed = kv_bytes_for_request(per_token, cfg.max_model_len, block)
    if platform == "cpu":
        gib = cpu_kv_cache_gib(cfg)
        cache = (round(gib) if gib >= 1 else gib) * GIB
        cache_from = f"{setting}.kv_cache_gib" + ("" if cfg.kv_cache_gib else " (CPU default)")
    else:
        gpu_cache = _gpu_cache(dep, actor, cfg, setting, dims, dtype_bytes)
        if gpu_cache is None:
            return
        cache, cache_from = gpu_cache
    fits = cache >= needed
    dep.kv_cache = KvCacheReport(
        bytes_per_token=per_token, block_size=block, request_gib=needed / GIB,
        cache_gib=max(cache, 0) / GIB, cache_from=cache_from, fits=fits,
        full_length_requests=max(cache, 0) / needed,
    )
    if not fits:
        if platform == "cuda" and cfg.kv_cache_gib is None:
            fix = (f"raise `{setting}.gpu_memory_utilization` (or give it a larger GPU), "
                   f"or lower `{setting}.max_model_len`")
        else:
            fix = (f"raise `{setting}.kv_cache_gib` to at least {math.ceil(needed / GIB * 10) / 10}"
                   f", or lower `{setting}.max_model_len`")
        dep.errors.append(
            f"the KV cache ({cache / GIB:.2f} GiB from {cache_from}) cannot hold one request of "
            f"`{setting}.max_model_len` = {cfg.max_model_len} tokens ({needed / GIB:.2f} GiB at "
            f"{per_token} bytes per token), so vLLM refuses to start: {fix}"
        )


def check_max_model_len(dep: DeploymentReport, cfg: EngineConfig, setting: str) -> None:
    """vLLM refuses a `max_model_len` beyond the model's own (from its config.json when
    local, else the table of known models)."""
    raw = _raw_config_json(cfg.model)
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


def check_dtype(dep: DeploymentReport, cfg: EngineConfig, setting: str, gpu_type: str) -> None:
    """bf16 needs compute capability 8.0 (vLLM: "Bfloat16 is only supported on GPUs with
    compute capability of at least 8.0"); `auto` falls back to float16 there by itself."""
    capability = COMPUTE_CAPABILITY.get(gpu_type)
    if cfg.dtype == "bfloat16" and capability is not None and capability < BF16_MIN_CAPABILITY:
        version = ".".join(str(part) for part in capability)
        dep.errors.append(
            f"`{setting}.dtype` = bfloat16 needs compute capability 8.0, the {gpu_type} has "
            f"{version}: set `{setting}.dtype` to float16 (or `{setting}.gpu_type` to the GPU "
            "the replicas really run on)"
        )


def _gpu_cache(
    dep: DeploymentReport,
    actor: ActorOptions,
    cfg: EngineConfig,
    setting: str,
    dims: ModelDims,
    dtype_bytes: int,
) -> tuple[float, str] | None:
    """(KV cache bytes, where they come from) of a GPU engine; None after an error."""
    gpu_type = cfg.gpu_type or actor.accelerator_type
    dep.gpu_type = gpu_type
    if gpu_type is None or gpu_type not in GPU_MEMORY_MIB:
        known = ", ".join(GPU_MEMORY_MIB)
        what = "no GPU type" if gpu_type is None else f"unknown GPU type {gpu_type!r}"
        dep.errors.append(f"{what}: set `{setting}.gpu_type` to one of {known}")
        return None
    check_dtype(dep, cfg, setting, gpu_type)
    capability = COMPUTE_CAPABILITY.get(gpu_type)
    if cfg.batch_invariant and capability is not None and capability < BF16_MIN_CAPABILITY:
        dep.errors.append(
            f"`{setting}.batch_invariant` needs compute capability 8.0 (vLLM), the {gpu_type} "
            f"has {'.'.join(str(p) for p in capability)}: set it to false"
        )
    # A tensor-parallel engine spreads weights and KV cache over its GPUs.
    gpus = cfg.tensor_parallel_size
    total = GPU_MEMORY_MIB[gpu_type] * (1 << 20)
    dep.gpu_memory_gib = round(total / GIB, 1)
    total *= gpus
    if actor.num_gpus < 1 and cfg.gpu_memory_utilization > actor.num_gpus:
        # vLLM refuses to start when less than utilization x total is free; a replica that
        # shares its GPU is only sure to find its own share free.
        dep.errors.append(
            f"the replica shares its GPU (num_gpus {actor.num_gpus}) but "
            f"`{setting}.gpu_memory_utilization` is {cfg.gpu_memory_utilization}: set it to at "
            f"most {actor.num_gpus} (and pin `{setting}.kv_cache_gib`)"
        )
        return None
    budget = cfg.gpu_memory_utilization * total
    weights = dims.num_parameters * dtype_bytes
    left = budget - weights - gpus * GPU_RESERVE_GIB * GIB
    if cfg.kv_cache_gib is not None:
        cache = cfg.kv_cache_gib * GIB
        if cache > left:
            dep.errors.append(
                f"`{setting}.kv_cache_gib` = {cfg.kv_cache_gib} GiB does not fit beside the "
                f"weights ({weights / GIB:.1f} GiB) and about {GPU_RESERVE_GIB} GiB of "
                f"activations in `{setting}.gpu_memory_utilization` x {gpu_type} "
                f"({budget / GIB:.1f} GiB): lower `{setting}.kv_cache_gib` to at most "
                f"{max(left, 0) / GIB:.1f}"
            )
        return cache, f"{setting}.kv_cache_gib"
    return left, (
        f"{setting}.gpu_memory_utilization {cfg.gpu_memory_utilization} of {gpu_type} less "
        f"weights {weights / GIB:.1f} GiB and ~{GPU_RESERVE_GIB} GiB activations (estimate)"
    )


# ---------------------------------------------------------------- printing


def format_report(report: ConfigReport) -> str:
    lines: list[str] = []
    for app in report.applications:
        lines.append(f"{report.source}: application {app.name}")
        for error in app.errors:
            lines.append(f"  ERROR {error}")
        for dep in app.deployments:
            where = dep.platform or "no engine"
            gpu = f" on {dep.gpu_type} ({dep.gpu_memory_gib} GiB)" if dep.gpu_memory_gib else ""
            lines.append(f"  {dep.name}: {where}{gpu}; actor {dep.actor} (from {dep.actor_from})")
            if dep.engine_args is not None:
                lines.append(f"    model {dep.model}; dims from {dep.model_dims_from}")
                lines.append(f"    engine args: {json.dumps(dep.engine_args, sort_keys=True)}")
                if dep.speculative_config is not None:
                    spec = json.dumps(dep.speculative_config, sort_keys=True)
                    lines.append(f"    speculative_config: {spec}")
                if dep.placement is not None:
                    place = json.dumps(dep.placement.model_dump(), sort_keys=True)
                    lines.append(f"    placement (tensor parallel {dep.tensor_parallel_size}): "
                                 f"{place}")
                if dep.max_model_len_limit is not None:
                    lines.append(f"    model's max length: {dep.max_model_len_limit} "
                                 f"({dep.max_model_len_from})")
                env = " ".join(f"{k}={v}" for k, v in sorted((dep.env or {}).items()))
                unset = f"; unset {' '.join(dep.env_unset)}" if dep.env_unset else ""
                lines.append(f"    env: {env}{unset}")
            if dep.kv_cache is not None:
                kv = dep.kv_cache
                verdict = "fits" if kv.fits else "DOES NOT FIT"
                lines.append(
                    f"    KV cache: {kv.bytes_per_token} B/token; one max_model_len request "
                    f"{kv.request_gib:.2f} GiB; cache {kv.cache_gib:.2f} GiB ({kv.cache_from}): "
                    f"{verdict}, {kv.full_length_requests:.1f} full-length requests"
                )
            if dep.tool_format is not None:
                lines.append(f"    tool format: {dep.tool_format}")
            for warning in dep.warnings:
                lines.append(f"    WARNING {warning}")
            for error in dep.errors:
                lines.append(f"    ERROR {error}")
    errors = report.errors
    lines.append("OK" if not errors else f"{len(errors)} error(s): this config cannot start")
    return "\n".join(lines)


def report_json(report: ConfigReport) -> str:
    payload = report.model_dump(mode="json")
    payload["ok"] = report.ok
    payload["errors"] = report.errors
    return json.dumps(payload, indent=2, sort_keys=True)

