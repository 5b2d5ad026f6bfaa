"""Where the replica of an engine that spans several GPUs runs: its Serve placement.

With `tensor_parallel_size` > 1 vLLM runs one worker process per GPU (executor `mp`, the
backend `engine_args.py` picks), started by the replica itself: they inherit the replica's
`CUDA_VISIBLE_DEVICES`, so the replica's own actor must hold all of the engine's GPUs, on one
node. One placement-group bundle holding the actor's CPUs, its pool resource and every GPU,
`STRICT_PACK`, says exactly that; Serve places the replica actor in the first bundle and
requires its `ray_actor_options` to fit there, so the bundle is built from those options: every
resource Ray turns them into a demand for (`ray_demand`, as Ray's own
`resources_from_ray_options` does: `num_cpus`, `num_gpus`, `memory`, `object_store_memory`,
`accelerator_type` as the `accelerator_type:<type>` resource, the custom `resources`). Serve
checks only CPUs, GPUs and custom resources against the bundle; an actor that demands memory or
an accelerator type the bundle lacks is never scheduled and the replica stays pending.
A bundle per GPU (vLLM's `ray` executor) would let Ray spread the ranks over nodes, away from
the replica and its candidate store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

STRATEGY = "STRICT_PACK"
# What Ray demands of a node for `accelerator_type: X` (`RESOURCE_CONSTRAINT_PREFIX`, and the
# amount `resources_from_ray_options` asks): a node started on such a GPU offers 1 of it.
ACCELERATOR_PREFIX = "accelerator_type:"
ACCELERATOR_DEMAND = 0.001


def ray_demand(actor: Mapping[str, Any]) -> dict[str, float]:
    """The resources Ray demands for an actor with these `ray_actor_options`, as Ray 2.x's
    `resources_from_ray_options` computes them (tests/unit/test_placement.py compares the two).

    >>> ray_demand({"num_cpus": 2, "memory": 8e9, "accelerator_type": "H100",
    ...             "resources": {"main_pool": 1}})
    {'main_pool': 1.0, 'CPU': 2.0, 'memory': 8000000000.0, 'accelerator_type:H100': 0.001}
    """
    demand = {str(name): float(amount) for name, amount in (actor.get("resources") or {}).items()}
    for option, resource in (("num_cpus", "CPU"), ("num_gpus", "GPU"),
                             ("memory", "memory"), ("object_store_memory", "object_store_memory")):
        value = actor.get(option)
        if value is not None:
            demand[resource] = float(int(value) if option == "memory" else value)
    if actor.get("accelerator_type") is not None:
        demand[f"{ACCELERATOR_PREFIX}{actor['accelerator_type']}"] = ACCELERATOR_DEMAND
    return demand


class Placement(BaseModel):
    """A deployment's Serve placement options (`placement_group_*` of its `deployments:`
    entry) and the GPUs its replica actor reserves."""

    num_gpus: float = Field(description="`ray_actor_options.num_gpus` of the replica.")
    placement_group_bundles: list[dict[str, float]]
    placement_group_strategy: str = STRATEGY


def engine_placement(tensor_parallel_size: int, actor: Mapping[str, Any]) -> Placement | None:
    """The placement of a replica whose engine spans `tensor_parallel_size` GPUs, given the
    rest of its `ray_actor_options` (`num_cpus`, `memory`, `accelerator_type`, `resources`);
    None for one GPU or fewer, where the actor options alone place it. The bundle holds all
    the actor demands with `num_gpus` set to every rank's GPU (Serve's default of one CPU
    where `num_cpus` is not given); resources of amount 0 are left out (Ray refuses them in a
    bundle)."""
    if tensor_parallel_size <= 1:
        return None
    demand = ray_demand({"num_cpus": 1, **actor, "num_gpus": tensor_parallel_size})
    bundle = {name: amount for name, amount in demand.items() if amount}
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
