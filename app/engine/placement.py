"""Where the replica of an engine that spans several GPUs runs: its Serve placement.

With `tensor_parallel_size` > 1 vLLM runs one worker process per GPU (executor `mp`, the
backend `engine_args.py` picks), started by the replica itself: they inherit the replica's
`CUDA_VISIBLE_DEVICES`, so the replica's own actor must hold all of the engine's GPUs, on one
node. One placement-group bundle holding the actor's CPUs, its pool resource and every GPU,
`STRICT_PACK`, says exactly that; Serve places the replica actor in the first bundle and
requires its `ray_actor_options` to fit there, so the bundle is built from those options.
A bundle per GPU (vLLM's `ray` executor) would let Ray spread the ranks over nodes, away from
the replica and its candidate store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

STRATEGY = "STRICT_PACK"


class Placement(BaseModel):
    """A deployment's Serve placement options (`placement_group_*` of its `deployments:`
    entry) and the GPUs its replica actor reserves."""

    num_gpus: float = Field(description="`ray_actor_options.num_gpus` of the replica.")
    placement_group_bundles: list[dict[str, float]]
    placement_group_strategy: str = STRATEGY


def engine_placement(tensor_parallel_size: int, actor: Mapping[str, Any]) -> Placement | None:
    """The placement of a replica whose engine spans `tensor_parallel_size` GPUs, given the
    rest of its `ray_actor_options` (`num_cpus`, `resources`); None for one GPU or fewer,
    where the actor options alone place it."""
    if tensor_parallel_size <= 1:
        return None
    bundle: dict[str, float] = {"CPU": float(actor.get("num_cpus", 1) or 0)}
    bundle["GPU"] = float(tensor_parallel_size)
    for name, amount in (actor.get("resources") or {}).items():
        bundle[str(name)] = float(amount)
    if not bundle["CPU"]:
        del bundle["CPU"]
    return Placement(num_gpus=tensor_parallel_size, placement_group_bundles=[bundle])


def placement_problems(
    tensor_parallel_size: int,
    actor: Mapping[str, Any],
    bundles: list[dict[str, float]] | None,
    strategy: str | None,
) -> list[str]:
    """What keeps a deployment with these options from giving its engine its GPUs on one
    node (empty: nothing). Each names the option to change."""
    expected = engine_placement(tensor_parallel_size, actor)
    if expected is None:
        return []
    problems = []
    if float(actor.get("num_gpus", 0) or 0) != expected.num_gpus:
        problems.append(
            f"set `ray_actor_options.num_gpus` to {tensor_parallel_size}: vLLM's tensor-parallel "
            "workers are the replica's own processes and use the GPUs it reserves"
        )
    if bundles != expected.placement_group_bundles or strategy != STRATEGY:
        problems.append(
            f"set `placement_group_bundles: {expected.placement_group_bundles}` and "
            f"`placement_group_strategy: {STRATEGY}` (one node holds every rank)"
        )
    return problems
