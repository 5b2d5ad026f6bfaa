"""configs/local-autoscale.yaml (issue #21): the local app with the router, the tool workers and
the main model each between 1 and 2 replicas on this 2-core machine, scaling within seconds,
and removed replicas keeping their requests up to the router's deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ray.serve.schema import ServeDeploySchema

from app.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SCALED = ("MainModel", "Router", "ToolWorker")
CORES = 2  # the local default machine


def application(name: str) -> dict[str, Any]:
    with open(CONFIGS / name) as f:
        (app,) = yaml.safe_load(f)["applications"]
    assert isinstance(app, dict)
    return app


def entries(name: str) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in application(name)["deployments"]}


def test_is_a_serve_config_with_local_args() -> None:
    with open(CONFIGS / "local-autoscale.yaml") as f:
        ServeDeploySchema.model_validate(yaml.safe_load(f))
    # What the app does is local.yaml's; only how the deployments run differs.
    assert application("local-autoscale.yaml")["args"] == application("local.yaml")["args"]
    assert set(entries("local-autoscale.yaml")) == set(entries("local.yaml"))


def test_router_tool_workers_and_main_model_scale_between_one_and_two_quickly() -> None:
    for name in SCALED:
        scaling = entries("local-autoscale.yaml")[name]["autoscaling_config"]
        assert scaling["min_replicas"] == 1 and scaling["max_replicas"] == 2, name
        # Seconds, not Serve's defaults (30 s up, 600 s down, a 30 s window), so a burst and
        # its end are both seen within a test.
        assert scaling["upscale_delay_s"] <= 5 and 10 <= scaling["downscale_delay_s"] <= 20
        assert scaling["look_back_period_s"] <= 5 and scaling["metrics_interval_s"] <= 1
        assert scaling["target_ongoing_requests"] <= 8, name


def test_every_replica_fits_the_two_cores_at_the_maximum() -> None:
    reserved = 0.0
    for entry in entries("local-autoscale.yaml").values():
        count = entry["autoscaling_config"]["max_replicas"]
        reserved += count * entry["ray_actor_options"]["num_cpus"]
    assert reserved <= CORES, reserved


def test_removed_replicas_keep_their_requests_up_to_the_deadline() -> None:
    config = load_config(application("local-autoscale.yaml")["args"])
    deadline = config.router.request_timeout_s
    for name in ("MainModel", "Router"):
        entry = entries("local-autoscale.yaml")[name]
        assert entry["graceful_shutdown_timeout_s"] >= deadline, name
        # A drained replica stops soon after its last request, not a whole loop later.
        assert entry["graceful_shutdown_wait_loop_s"] <= 2, name
    sidecar = entries("local-autoscale.yaml")["Sidecar"]
    assert sidecar["graceful_shutdown_timeout_s"] >= config.speculation.sidecar_timeout_s


def test_main_model_and_sidecar_route_by_cache_affinity() -> None:
    """Both are called by the Router with the tenant's chat payload: cache-affinity routing
    (deployments/prefix_router.py), its knobs accepted as written."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve.config import RequestRouterConfig

    from deployments.prefix_router import PrefixAffinityRouter

    for name in ("MainModel", "Sidecar"):
        config = RequestRouterConfig(**entries("local-autoscale.yaml")[name]
                                     ["request_router_config"])
        router_class = config.get_request_router_class()
        assert router_class.__qualname__ == PrefixAffinityRouter.__qualname__, name
        router = router_class(deployment_id=DeploymentID(name=name, app_name="ooo-spec"),
                              handle_source=DeploymentHandleSource.UNKNOWN)
        router.initialize_state(**config.request_router_kwargs)  # a misspelt knob raises


def test_no_replica_restarts_when_the_entries_replace_local_ones() -> None:
    """The entries differ from local.yaml's only in options Serve applies to running replicas
    (autoscaling, graceful shutdown): switching a running app to them reloads no model."""
    local, scaled = entries("local.yaml"), entries("local-autoscale.yaml")
    changed = {n for n in local if local[n]["ray_actor_options"] != scaled[n]["ray_actor_options"]}
    assert changed == set()
    # Serve counts request routers into the app's code version (every replica restarts).
    routers = {n for n in local
               if local[n].get("request_router_config") != scaled[n].get("request_router_config")}
    assert routers == set()
