"""The deployment options of the cluster configs really reach Ray Serve (issues #6, #14).

Each configs/cluster-*.yaml application is deployed as KubeRay deploys serveConfigV2, through
Serve's declarative API (`deployments.app:build_app` from its `args`, then its `deployments:`
entries on top), GPUs swapped for CPU (num_gpus 0, no accelerator_type; the pool resources
main_pool, sidecar_pool, router_pool and cpu_pool stay), on a local Ray that offers none of the
pool resources, nor any CPU or GPU: the Serve controller registers every deployment with its
options, but no replica can ever be scheduled, so no engine loads. What the controller holds
(`get_serve_details()`: each deployment's config, target replica count and the resources its
replicas request from Ray) is then compared with the config file's entries.

The Ray instance runs in a subprocess (this module run with `-m`, `ray.init(address="local")`,
Serve proxies disabled), so it neither meets nor disturbs the session app of tests/conftest.py
that e2e tests start earlier in the same pytest process.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import load_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "cpu-dev": ROOT / "configs" / "cluster-cpu-dev.yaml",
    "gpu-h100-l4": ROOT / "configs" / "cluster-gpu-h100-l4.yaml",
}
DEPLOYMENTS = ("Router", "MainModel", "Sidecar", "ToolWorker")
POOLS = ("main_pool", "sidecar_pool", "router_pool", "cpu_pool")
PROBE_TIMEOUT_S = 300  # a loaded 2-core box; idle, the whole probe takes ~15-30 s


def application(path: Path) -> dict[str, Any]:
    with open(path) as f:
        serve_config = yaml.safe_load(f)
    (app,) = serve_config["applications"]
    assert isinstance(app, dict)
    return app


def cpu_only(app: dict[str, Any]) -> dict[str, Any]:
    """The same application with every GPU request swapped for CPU; pool resources are kept."""
    swapped = copy.deepcopy(app)
    for entry in swapped["deployments"]:
        actor = entry.get("ray_actor_options")
        if actor is not None:
            actor["num_gpus"] = 0
            actor.pop("accelerator_type", None)
    return swapped


def entries(name: str) -> dict[str, dict[str, Any]]:
    """Deployment name -> its (CPU-only) `deployments:` entry in the config file."""
    return {e["name"]: e for e in cpu_only(application(CONFIGS[name]))["deployments"]}


# --- the probe: runs in its own process, on its own Ray ----------------------------------------


def _probe(out: Path) -> None:
    """Deploy every cluster config (CPU-only) on a fresh local Ray, write the controller's view."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    # No pool resources, and no CPUs or GPUs either (Serve's controller needs none): even a
    # deployment that lost its pool resource on the way could not start a replica here.
    ray.init(
        address="local",
        num_cpus=0,
        num_gpus=0,
        include_dashboard=False,
        namespace=f"ooo-spec-serve-options-{uuid.uuid4().hex[:8]}",
        log_to_driver=False,
        # The build task imports deployments.app from the working tree.
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    try:
        offered = ray.cluster_resources()
        serve.start(proxy_location="Disabled")
        apps = {f"serve-options-{name}": name for name in CONFIGS}
        client = _get_global_client()
        assert client is not None
        # Not blocking: the deployments get registered, but their replicas can never start.
        client.deploy_apps(ServeDeploySchema.model_validate({"applications": [
            {**cpu_only(application(CONFIGS[name])), "name": app_name,
             "route_prefix": f"/{app_name}"}
            for app_name, name in apps.items()
        ]}))
        deadline = time.monotonic() + 60
        while True:  # the build task runs first
            details = client.get_serve_details()
            held = details.get("applications", {})
            if all(held.get(a, {}).get("deployments") for a in apps) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        result = {
            "offered": offered,
            "applications": {name: held.get(app_name) for app_name, name in apps.items()},
        }
        out.write_text(json.dumps(result, default=str))
    finally:
        # This Ray is private to the probe process: shutting it down stops Serve's controller
        # and the pending replicas with it. (`serve.shutdown()` would first wait out every
        # unschedulable replica's graceful shutdown, 20 s.)
        ray.shutdown()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the Serve controller holds, per config name (the probe's output)."""
    out = tmp_path_factory.mktemp("serve_options") / "details.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_serve_options", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )
    assert proc.returncode == 0 and out.exists(), (
        f"probe failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    result: dict[str, Any] = json.loads(out.read_text())
    # The guarantee that nothing was loaded: the probe's Ray offers no pool, CPU or GPU.
    offered = result["offered"]
    assert not set(POOLS) & set(offered) and not offered.get("CPU") and not offered.get("GPU"), (
        offered
    )
    return result


# --- checks ---------------------------------------------------------------------------------------


def test_swap_changes_only_gpu_requests() -> None:
    original = {e["name"]: e for e in application(CONFIGS["gpu-h100-l4"])["deployments"]}
    swapped = entries("gpu-h100-l4")
    assert original["MainModel"]["ray_actor_options"]["num_gpus"] == 1  # work for the swap
    for name in DEPLOYMENTS:
        before = original[name]["ray_actor_options"]
        after = swapped[name]["ray_actor_options"]
        assert after["num_gpus"] == 0 and "accelerator_type" not in after
        rest = {k: v for k, v in before.items() if k not in ("num_gpus", "accelerator_type")}
        assert {k: v for k, v in after.items() if k != "num_gpus"} == rest
        assert set(after["resources"]) & set(POOLS), f"{name}: no pool resource to pin it"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_deployment_registered(held: dict[str, Any], name: str) -> None:
    app = held["applications"][name]
    assert app is not None, f"{name}: the application never reached the controller"
    assert app["status"] != "DEPLOY_FAILED", app.get("message")
    deployments = app["deployments"]
    config = load_config(application(CONFIGS[name])["args"])
    assert set(deployments) == set(config.deployment_names()), sorted(deployments)
    # Pinned to pools this Ray lacks: every replica is still waiting for a node (Serve calls
    # that STARTING); none was placed or ran its constructor, so no engine loaded.
    for deployment_name, deployment in deployments.items():
        for replica in deployment.get("replicas", []):
            assert replica["state"] == "STARTING", (deployment_name, replica)
            assert replica.get("pid") is None and replica.get("node_id") is None, replica


@pytest.mark.parametrize("deployment_name", DEPLOYMENTS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_options_reach_serve(held: dict[str, Any], name: str, deployment_name: str) -> None:
    entry = entries(name)[deployment_name]
    deployments = (held["applications"][name] or {}).get("deployments", {})
    assert deployment_name in deployments, sorted(deployments)
    deployment = deployments[deployment_name]
    held_config = deployment["deployment_config"]

    for option in ("max_ongoing_requests", "graceful_shutdown_timeout_s",
                   "graceful_shutdown_wait_loop_s", "health_check_period_s",
                   "health_check_timeout_s"):
        if option in entry:
            assert held_config[option] == entry[option], option

    want = entry["autoscaling_config"]
    autoscaling = held_config["autoscaling_config"]
    assert autoscaling is not None
    assert {key: autoscaling[key] for key in want} == want
    assert held_config.get("num_replicas") in (None, "auto")
    assert deployment["target_num_replicas"] == want["min_replicas"]

    actor = held_config["ray_actor_options"]
    options = entry["ray_actor_options"]
    assert actor["num_cpus"] == options["num_cpus"]
    assert actor.get("num_gpus", 0) == 0
    assert "accelerator_type" not in actor
    assert actor.get("resources", {}) == options["resources"]

    # What each replica asks Ray for, as the controller will schedule it.
    want_resources: dict[str, float] = {"CPU": options["num_cpus"], **options["resources"]}
    got_resources = {k: v for k, v in deployment["required_resources"].items() if v or k == "CPU"}
    assert got_resources == want_resources
    assert set(options["resources"]) & set(POOLS), f"{deployment_name} is pinned to no pool"


if __name__ == "__main__":
    _probe(Path(sys.argv[1]))
