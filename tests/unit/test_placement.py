"""app/engine/placement.py and the engine arguments of a tensor-parallel engine: the replica
holds every GPU of its engine on one node, and vLLM runs the ranks as its own processes."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import EngineConfig
from app.engine.engine_args import cpu_launch, cuda_launch
from app.engine.placement import STRATEGY, engine_placement, placement_problems, ray_demand


def test_one_gpu_needs_no_placement_group() -> None:
    assert engine_placement(1, {"num_cpus": 8, "num_gpus": 1}) is None
    assert placement_problems(1, {"num_gpus": 1}, None, None) == []


def test_the_bundle_holds_the_actors_cpus_pool_and_every_gpu() -> None:
    placement = engine_placement(4, {"num_cpus": 8, "resources": {"main_pool": 1}})
    assert placement is not None
    assert placement.num_gpus == 4
    assert placement.placement_group_bundles == [{"CPU": 8.0, "GPU": 4.0, "main_pool": 1.0}]
    assert placement.placement_group_strategy == STRATEGY == "STRICT_PACK"
    # No CPU reserved: the bundle asks for none (Ray refuses a zero-sized resource in it).
    zero = engine_placement(2, {"num_cpus": 0})
    assert zero is not None and zero.placement_group_bundles == [{"GPU": 2.0}]


def test_problems_name_the_options_to_set() -> None:
    actor = {"num_cpus": 8, "num_gpus": 1, "resources": {"main_pool": 1}}
    problems = placement_problems(2, actor, None, None)
    assert any("`ray_actor_options.num_gpus` to 2" in p for p in problems)
    assert any("placement_group_bundles" in p for p in problems)
    fixed = {**actor, "num_gpus": 2}
    bundles = [{"CPU": 8.0, "GPU": 2.0, "main_pool": 1.0}]
    assert placement_problems(2, fixed, bundles, "STRICT_PACK") == []
    assert placement_problems(2, fixed, bundles, "PACK")  # PACK may spread over nodes


def test_tensor_parallel_engines_run_their_ranks_as_the_replicas_processes() -> None:
    one = cuda_launch(EngineConfig(dtype="bfloat16"), "m").kwargs
    assert "tensor_parallel_size" not in one and "distributed_executor_backend" not in one
    for launch in (cuda_launch, cpu_launch):
        kwargs = launch(EngineConfig(tensor_parallel_size=2), "m").kwargs
        assert kwargs["tensor_parallel_size"] == 2
        assert kwargs["distributed_executor_backend"] == "mp"


# ---- every resource Ray demands of the actor is in the bundle (Ray's own conversion) ----
ACTORS = [
    {"num_cpus": 8, "resources": {"main_pool": 1}},
    {"num_cpus": 4, "memory": 64 * 2**30, "accelerator_type": "H100",
     "resources": {"main_pool": 1, "nvme": 0.5}},
    {"num_cpus": 0, "memory": 10**10, "object_store_memory": 2**30},
    {"accelerator_type": "L4"},
]


@pytest.mark.parametrize("actor", ACTORS)
def test_ray_demand_is_rays_own_conversion(actor: dict[str, Any]) -> None:
    from ray._common.utils import resources_from_ray_options

    options = {**actor, "num_gpus": 2}
    assert ray_demand(options) == {k: float(v) for k, v in
                                   resources_from_ray_options(options).items()}


@pytest.mark.parametrize("actor", ACTORS)
def test_the_bundle_holds_every_resource_ray_demands_of_the_replica(actor: dict[str, Any]
                                                                     ) -> None:
    """What the replica actor (with the engine's GPUs) demands, as Ray computes it, fits the
    bundle: memory and `accelerator_type:<type>` included, or the replica stays pending."""
    from ray._common.utils import resources_from_ray_options

    placement = engine_placement(2, actor)
    assert placement is not None
    bundle = placement.placement_group_bundles[0]
    demanded = resources_from_ray_options({"num_cpus": 1, **actor, "num_gpus": 2})
    for resource, amount in demanded.items():
        assert bundle.get(resource, 0) >= amount, resource
    assert set(bundle) == {r for r, a in demanded.items() if a}


def test_serve_takes_the_placement_with_the_actor_options() -> None:
    """Serve's own check of a deployment's options (the actor fits the first bundle)."""
    from ray.serve._private.config import ReplicaConfig

    actor = ACTORS[1]
    placement = engine_placement(4, actor)
    assert placement is not None
    config = ReplicaConfig.create(
        lambda: None, ray_actor_options={**actor, "num_gpus": placement.num_gpus},
        placement_group_bundles=placement.placement_group_bundles,
        placement_group_strategy=placement.placement_group_strategy)
    assert set(config.resource_dict) <= set(placement.placement_group_bundles[0])


def test_memory_and_accelerator_type_are_named_when_the_bundle_lacks_them() -> None:
    actor = {"num_cpus": 8, "num_gpus": 2, "memory": 2**34, "accelerator_type": "H100"}
    old = [{"CPU": 8.0, "GPU": 2.0}]  # what the last round recommended
    problems = placement_problems(2, actor, old, STRATEGY)
    assert len(problems) == 1 and "'memory'" in problems[0]
    assert "accelerator_type:H100" in problems[0]
