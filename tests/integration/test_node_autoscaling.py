"""Nodes follow replicas (issue #21): Ray's own autoscaler, with its fake multi-node provider
standing in for KubeRay's worker groups, adds a node of the main pool when Serve asks for a
second main replica, and removes it once that replica is gone and the node stayed idle.

The node types are the worker groups of the cpu-dev overlay (k8s/overlays/cpu-dev): each offers
its group's custom resource (main_pool, sidecar_pool, router_pool, cpu_pool) and its pod's CPUs,
so a replica pinned to a pool can only run on a node of that group, as on Kubernetes. The
replica is a tiny deployment with MainModel's `ray_actor_options` from
configs/cluster-cpu-dev.yaml (its CPU and `main_pool`); no engine is loaded. Serve asks for the
second replica itself: its `autoscaling_config` scales it to 2 under held requests.

`ray.cluster_utils.AutoscalingCluster` is not used: its start() runs `ray stop --force`, which
would stop every Ray on the machine. This module starts its own head instead (`ray start --head
--autoscaling-config=...` with RAY_FAKE_CLUSTER=1, as AutoscalingCluster does) on its own ports
and temp dir, from a subprocess in its own process group (the pytest process may already be
connected to the session app's Ray), and ends exactly that process group.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_CONFIG = ROOT / "configs" / "cluster-cpu-dev.yaml"
OVERLAY = "cpu-dev"
POOLS = ("main_pool", "sidecar_pool", "router_pool", "cpu_pool")
IDLE_TIMEOUT_MINUTES = 0.1   # 6 s: the scale-down is seen within the test
PROBE_TIMEOUT_S = 420        # the probe's own waits are bounded below this
STEP_TIMEOUT_S = 120         # each wait for the autoscaler or Serve
APP = "pool-probe"


# --- the cluster config, from the overlay ------------------------------------------------------


def node_types() -> dict[str, dict[str, Any]]:
    """One autoscaler node type per worker group of the cpu-dev overlay: its pool resource and
    its pod's CPU limit. Up to two nodes each (the overlay's maximum is one: one more is what
    this test shows), none at the start."""
    from tests.unit.test_k8s_manifests import rendered, the

    cluster = the(rendered(OVERLAY), "RayService")["spec"]["rayClusterConfig"]
    types: dict[str, dict[str, Any]] = {}
    for group in cluster["workerGroupSpecs"]:
        cpu = group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        pools = {k: float(v) for k, v in (group.get("resources") or {}).items()}
        types[group["groupName"]] = {
            "resources": {"CPU": float(cpu), **pools},
            "node_config": {},
            "min_workers": 0,
            "max_workers": 2,
        }
    return types


def cluster_config(types: dict[str, dict[str, Any]], gcs_address: str) -> dict[str, Any]:
    """An autoscaler cluster config for the fake multi-node provider (the fields of Ray's
    fake_multi_node example, which the wheel does not ship). The head offers no CPU and no pool,
    like KubeRay's head with num-cpus 0."""
    return {
        "cluster_name": "ooo-spec-fake",
        "max_workers": sum(t["max_workers"] for t in types.values()),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_TIMEOUT_MINUTES,
        "provider": {
            "type": "fake_multinode",
            # Workers join this head, not the default 6379 (another Ray's, maybe).
            "gcs_address": gcs_address,
            # Every fake node has this machine's IP: the autoscaler tells them apart by id.
            "use_node_id_as_ip": True,
            "disable_launch_config_check": True,
            "disable_node_updaters": True,
        },
        "auth": {"ssh_user": "ubuntu"},
        "docker": {},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            **types,
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
        },
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def main_actor_options() -> dict[str, Any]:
    """MainModel's `ray_actor_options` in the cpu-dev cluster config (CPU and main_pool)."""
    with open(CLUSTER_CONFIG) as f:
        (app,) = yaml.safe_load(f)["applications"]
    (entry,) = [d for d in app["deployments"] if d["name"] == "MainModel"]
    options: dict[str, Any] = dict(entry["ray_actor_options"])
    return options


# --- the probe: its own process, its own Ray head ----------------------------------------------


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ray_ip() -> str:
    from ray.util import get_node_ip_address

    return str(get_node_ip_address())


def parse_gauges(text: str, name: str) -> dict[str, float]:
    """NodeType -> value of one autoscaler gauge in Prometheus text format."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{name}\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            found[labels.get("NodeType", "")] = float(match["value"])
    return found


class Probe:
    """Runs in the subprocess: the head, Serve, the scale-up and down, and a log of what the
    autoscaler and Ray reported (written to `out` as JSON, even when a step fails)."""

    def __init__(self, workdir: Path, config_in: dict[str, Any], out: Path) -> None:
        self.workdir = workdir
        self.out = out
        self.types: dict[str, dict[str, Any]] = config_in["node_types"]
        self.actor_options: dict[str, Any] = config_in["actor_options"]
        (self.gcs, self.client, self.dashboard, self.agent, self.metrics,
         self.autoscaler_metrics) = free_ports(6)
        # This machine's address, which Ray's nodes register under (even given 127.0.0.1).
        self.ip = str(ray_ip())
        self.log: dict[str, Any] = {"samples": [], "steps": []}
        self.t0 = time.monotonic()

    def start_head(self) -> None:
        config = cluster_config(self.types, f"{self.ip}:{self.gcs}")
        path = self.workdir / "autoscaling.json"
        path.write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                    "AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics)})
        ray_cli = str(Path(sys.executable).parent / "ray")
        # To a file, not a pipe: the daemons it starts would hold a pipe open.
        with open(self.workdir / "ray-start.log", "wb") as log:
            subprocess.run(
                [ray_cli, "start", "--head", f"--port={self.gcs}",
                 f"--temp-dir={self.workdir / 'ray'}",
                 f"--autoscaling-config={path}", "--num-cpus=0", "--include-dashboard=false",
                 f"--dashboard-port={self.dashboard}", f"--ray-client-server-port={self.client}",
                 f"--dashboard-agent-listen-port={self.agent}",
                 f"--metrics-export-port={self.metrics}", "--disable-usage-stats"],
                env=env, check=True, timeout=STEP_TIMEOUT_S, stdout=log, stderr=log)

    def nodes(self) -> dict[str, int]:
        """Alive worker nodes per pool (by the pool resource each offers)."""
        import ray

        counts = {pool: 0 for pool in POOLS}
        for node in ray.nodes():
            if node["Alive"]:
                for pool in POOLS:
                    if node["Resources"].get(pool):
                        counts[pool] += 1
        return counts

    def sample(self) -> dict[str, Any]:
        text = httpx.get(f"http://{self.ip}:{self.autoscaler_metrics}/metrics", timeout=5).text
        entry = {"t_s": round(time.monotonic() - self.t0, 1), "nodes": self.nodes(),
                 "active": parse_gauges(text, "autoscaler_active_nodes"),
                 "pending": parse_gauges(text, "autoscaler_pending_nodes"),
                 "replicas": self.replicas()}
        self.log["samples"].append(entry)
        return entry

    def replicas(self) -> int:
        from ray import serve

        try:
            status = serve.status().applications[APP].deployments["PoolProbe"]
        except KeyError:
            return 0
        return int(status.replica_states.get("RUNNING", 0))

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if check(self.sample()):
                    self.log["steps"].append({"step": what, "t_s": time.monotonic() - self.t0})
                    self.save()
                    return
            except httpx.HTTPError:
                pass  # the autoscaler's metrics server is not up yet
            time.sleep(1)
        self.save()
        raise TimeoutError(f"{what}: not within {STEP_TIMEOUT_S} s")

    def save(self) -> None:
        self.out.write_text(json.dumps(self.log))

    def run(self) -> None:
        import ray
        from ray import serve

        self.start_head()
        ray.init(address=f"{self.ip}:{self.gcs}", log_to_driver=False)
        self.log["head"] = self.nodes()
        serve.start(proxy_location="Disabled")

        actor_options = self.actor_options

        # Defined here so Serve ships it by value: no import path needed on the fake nodes.
        @serve.deployment(
            name="PoolProbe", ray_actor_options=actor_options, max_ongoing_requests=4,
            autoscaling_config={"min_replicas": 1, "max_replicas": 2,
                                "target_ongoing_requests": 1, "metrics_interval_s": 0.5,
                                "look_back_period_s": 2, "upscale_delay_s": 0,
                                "downscale_delay_s": 3},
            graceful_shutdown_timeout_s=5, graceful_shutdown_wait_loop_s=0.5)
        class PoolProbe:
            async def hold(self, seconds: float) -> str:
                await asyncio.sleep(seconds)
                return str(ray.get_runtime_context().get_node_id())

        handle = serve.run(PoolProbe.bind(), name=APP, route_prefix=None, blocking=False)
        self.wait("one main node for the first replica",
                  lambda s: s["replicas"] == 1 and s["nodes"]["main_pool"] == 1)
        # Held requests: Serve asks for a second replica, which needs a second main node.
        held = [handle.hold.remote(60.0) for _ in range(3)]
        self.wait("a second main node, the second replica running on it",
                  lambda s: s["replicas"] == 2 and s["nodes"]["main_pool"] == 2)
        for response in held:
            response.cancel()
        self.wait("one main node again after the idle timeout",
                  lambda s: s["replicas"] == 1 and s["nodes"]["main_pool"] == 1)
        self.log["ok"] = True
        self.save()


def _probe_main(workdir: str, config_in: str, out: str) -> None:
    Probe(Path(workdir), json.loads(Path(config_in).read_text()), Path(out)).run()


def end_process_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the probe and everything it started (the head's processes and the fake nodes'
    inherit its process group): SIGTERM, then SIGKILL for what is left."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def left_behind(workdir: Path) -> list[int]:
    """Pids of processes whose command line names the probe's temp dir (its Ray's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(workdir) in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def probe_log() -> dict[str, Any]:
    # A short path: Ray's unix sockets live under the temp dir (a 107-byte limit).
    workdir = Path(tempfile.mkdtemp(prefix="ooo-as-", dir="/tmp"))
    config_in = workdir / "in.json"
    config_in.write_text(json.dumps({"node_types": node_types(),
                                     "actor_options": main_actor_options()}))
    out = workdir / "log.json"
    output = workdir / "probe.log"  # a file: Ray's daemons inherit the probe's stdout
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # `ray start` turns token authentication on by default, which the local drivers of these
    # tests do not use: this private, loopback-only cluster runs without, like ray.init's.
    env["RAY_AUTH_MODE"] = "disabled"
    with open(output, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_node_autoscaling",
             str(workdir), str(config_in), str(out)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group: everything it starts ends with it
    try:
        proc.wait(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        end_process_group(proc)
        proc.wait(timeout=30)
    leftovers = left_behind(workdir)
    for pid in leftovers:  # started by this probe (they name its temp dir), nothing else
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and log.get("ok"), (
        f"probe failed (rc={proc.returncode}):\n{output.read_text(errors='replace')[-6000:]}\n"
        f"{json.dumps(log)[-4000:]}")
    assert not leftovers, f"processes outlived the probe's process group: {leftovers}"
    shutil.rmtree(workdir, ignore_errors=True)  # kept when the probe failed, to read its logs
    return log


# --- checks ------------------------------------------------------------------------------------


def test_node_types_are_the_overlay_pools() -> None:
    types = node_types()
    assert set(types) == {"main", "sidecar", "router", "cpu"}
    for name, pool in (("main", "main_pool"), ("sidecar", "sidecar_pool"),
                       ("router", "router_pool"), ("cpu", "cpu_pool")):
        assert types[name]["resources"].get(pool, 0) > 0, (name, types[name])
        others = set(POOLS) - {pool}
        assert not others & set(types[name]["resources"]), (name, types[name])
    assert main_actor_options()["resources"] == {"main_pool": 1}


def test_cluster_config_is_valid_for_the_autoscaler() -> None:
    from ray.autoscaler._private.util import validate_config

    validate_config(cluster_config(node_types(), "127.0.0.1:1"))


def test_a_second_main_replica_brings_a_main_node_and_its_end_removes_it(
    probe_log: dict[str, Any],
) -> None:
    samples = probe_log["samples"]
    assert probe_log["head"] == {pool: 0 for pool in POOLS}  # the head offers no pool
    # Only main nodes were ever added: not one of the other pools.
    for sample in samples:
        assert sample["nodes"]["sidecar_pool"] == sample["nodes"]["router_pool"] == 0, sample
        assert sample["nodes"]["cpu_pool"] == 0, sample
        for node_type in ("sidecar", "router", "cpu"):
            assert not sample["active"].get(node_type) and not sample["pending"].get(node_type)
    peak = max(s["nodes"]["main_pool"] for s in samples)
    assert peak == 2, samples
    # The autoscaler's own gauges (charted in the Grafana dashboard) saw the main node too.
    assert max(s["active"].get("main", 0) for s in samples) == 2, samples
    # Up, then down: the second node came and went, the first one (with its replica) stayed.
    up = next(i for i, s in enumerate(samples) if s["nodes"]["main_pool"] == 2)
    assert samples[-1]["nodes"]["main_pool"] == 1 and samples[-1]["replicas"] == 1
    assert any(s["replicas"] == 2 for s in samples[up:]), samples


if __name__ == "__main__":
    _probe_main(*sys.argv[1:4])
