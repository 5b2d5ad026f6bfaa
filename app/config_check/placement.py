"""Where each deployment runs: its actor options (from the Serve config's `deployments:` entry or
the code's default), a tensor-parallel engine's placement and its pool's GPUs per pod, and the
baselines on the main model's hardware."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from app.config import MAIN_SUFFIX, AppConfig, EngineConfig
from app.config_check.model_info import raw_config_json
from app.config_check.report import ApplicationReport, DeploymentReport
from app.engine.placement import engine_placement, placement_problems

# The keys of Serve's `ray_actor_options` that place a replica: each becomes a resource Ray
# demands of the node (app/engine/placement.ray_demand), and so of a tensor-parallel bundle.
_ACTOR_KEYS = ("num_cpus", "num_gpus", "memory", "object_store_memory", "resources",
               "accelerator_type")
# Where a deployment without a `deployments:` entry takes its actor options from.
CODE_DEFAULT = "code default (deployments/app.py)"


class ActorOptions(BaseModel):
    """The part of a deployment's Serve `ray_actor_options` that decides where it runs."""

    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    memory: int | None = None
    object_store_memory: int | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    accelerator_type: str | None = None


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
    raw = raw_config_json(cfg.model) if tp > 1 else None
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


def check_baseline_hardware(
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
