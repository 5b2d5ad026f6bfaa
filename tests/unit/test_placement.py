"""app/engine/placement.py and the engine arguments of a tensor-parallel engine: the replica
holds every GPU of its engine on one node, and vLLM runs the ranks as its own processes."""

from __future__ import annotations

from app.config import EngineConfig
from app.engine.engine_args import cpu_launch, cuda_launch
from app.engine.placement import STRATEGY, engine_placement, placement_problems


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
