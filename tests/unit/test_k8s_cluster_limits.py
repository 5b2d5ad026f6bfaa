"""The cluster's limits on the rendered overlays (issues #39 and #44), beside
test_k8s_manifests.py, whose renderer and helpers these checks use:

- Ray's ports: every Ray node listens on fixed ports (rayStartParams), checked against `ray
  start`'s own options; a worker pod (tool workers, and the MCP servers they start, included)
  reaches the head on exactly the ports a Ray worker needs, listed below with the reason, and
  never the dashboard (8265) or the dashboard agent (52365, a job API); the agents are reached
  from the head only;
- the head's only egress out of the namespace: the API server's own addresses, pinned per
  overlay by k8s/pin_overlay.py (which also fills the GPU overlay's image digests);
- Pod Security Admission: the namespace of each overlay carries the `restricted` labels, and
  every pod satisfies that profile;
- read-only pods that start: every variable through which vLLM, FlashInfer, Triton, torch, CUDA,
  numba, outlines and the Hugging Face libraries choose where they write is set in every Ray
  container and points under a writable volume mounted there, and what vLLM and huggingface_hub
  resolve from that environment lands there too;
- no fixed API key in the docs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_k8s_manifests import (
    GPU_OVERLAY,
    K8S,
    OVERLAYS,
    REPO_ROOT,
    TOOL_GROUP,
    Obj,
    _load_module,
    _rules,
    _selects,
    container_env,
    groups,
    kustomize,
    pod_labels,
    pod_templates,
    ray_containers,
    rendered,
    the,
)

pin = _load_module("pin_overlay")

# ---------------------------------------------------------------------------------------------
# Ray's ports

# The ports every Ray node is told to use (rayStartParams of the head and of every worker
# group), as `ray start` options. Ray picks each of these at random unless told.
FIXED_PORTS = {
    "node-manager-port": 6380,
    "object-manager-port": 6381,
    "dashboard-agent-grpc-port": 6382,
    "runtime-env-agent-port": 6383,
    "dashboard-agent-listen-port": 52365,
    "metrics-export-port": 8080,
    "min-worker-port": 10002,
    "max-worker-port": 19999,
}
# `ray start` port options left at Ray's default on purpose, and why.
DEFAULT_PORTS = {
    "port": "the head's GCS, Ray's default 6379 (workers join at head-svc:6379)",
    "dashboard-port": "the head's dashboard, Ray's default 8265, for the KubeRay operator only",
    "ray-client-server-port": "the head's Ray client server (10001): unused, no policy admits it",
    "redis-shard-ports": "no Redis: GCS keeps its state in memory",
    "worker-port-list": "the worker ports are the min..max range above",
}
WORKER_PORTS = set(range(FIXED_PORTS["min-worker-port"], FIXED_PORTS["max-worker-port"] + 1))
GCS, RAYLET, OBJECT_MANAGER = 6379, FIXED_PORTS["node-manager-port"], FIXED_PORTS[
    "object-manager-port"]
AGENTS = {
    FIXED_PORTS["dashboard-agent-grpc-port"],
    FIXED_PORTS["runtime-env-agent-port"],
    FIXED_PORTS["dashboard-agent-listen-port"],
}
DASHBOARD, AGENT_HTTP = 8265, 52365

# What a worker pod opens on the head, and why (k8s/README.md, "Ray's ports", says the same).
HEAD_PORTS_FOR_WORKERS: dict[str, tuple[set[int], str]] = {
    "gcs": ({GCS}, "every node registers with GCS; every Ray process keeps a connection to it"),
    "raylet": ({RAYLET}, "worker leases and scheduling go through the raylets, the head's too"),
    "object manager": ({OBJECT_MANAGER}, "objects move between nodes' object managers"),
    "workers": (WORKER_PORTS, "actor calls: Serve's controller runs on the head"),
}
# What Ray pods open on one another's worker pods: the same but GCS, which is on the head only.
WORKER_PORTS_FOR_RAY_PODS = {RAYLET, OBJECT_MANAGER} | WORKER_PORTS
ALL_PORTS = set(range(1, 65536))


def _port_set(rule: Obj) -> set[int]:
    """The ports one NetworkPolicy rule allows (none listed: all)."""
    ports = rule.get("ports")
    if not ports:
        return ALL_PORTS
    allowed: set[int] = set()
    for entry in ports:
        assert entry.get("protocol", "TCP") == "TCP"
        allowed |= set(range(entry["port"], entry.get("endPort", entry["port"]) + 1))
    return allowed


def reachable(objects: list[Obj], source: dict[str, str], target: dict[str, str]) -> set[int]:
    """Every TCP port a pod with labels `source` can open on a pod with labels `target` (same
    namespace): allowed by some egress rule of the source and some ingress rule of the target."""
    namespace = the(objects, "RayService")["metadata"].get("namespace", "default")
    out: set[int] = set()
    for rule in _rules(objects, source, "egress"):
        if any(_selects(peer, target, namespace) for peer in rule.get("to", [{"ipBlock": {}}])):
            out |= _port_set(rule)
    into: set[int] = set()
    for rule in _rules(objects, target, "ingress"):
        if any(_selects(peer, source, namespace) for peer in rule.get("from", [{}])):
            into |= _port_set(rule)
    return out & into


def start_params(rayservice: Obj) -> dict[str, dict[str, str]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    params = {"head": cluster["headGroupSpec"]["rayStartParams"]}
    for name, group in groups(rayservice).items():
        params[name] = group.get("rayStartParams", {})
    return params


def test_fixed_ports_are_rays_own_options() -> None:
    """Every port option of `ray start` (Ray's own list, from its CLI) is either fixed on every
    node or deliberately left at Ray's default; a new port option in a Ray upgrade fails here
    until someone decides which, and the NetworkPolicies follow."""
    scripts = pytest.importorskip("ray.scripts.scripts")
    options = {p.name.replace("_", "-") for p in scripts.start.params}
    port_options = {name for name in options if "port" in name and name != "port-forward"}
    assert set(FIXED_PORTS) <= options
    assert port_options == set(FIXED_PORTS) | set(DEFAULT_PORTS)
    # Each node's agent sends task events through GCS; with this Ray option on, every agent
    # would POST them to the head's dashboard (8265), which no worker pod may reach.
    import ray

    assert ray._config.enable_task_events_to_dashboard_head() is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_ray_node_listens_on_the_fixed_ports(overlay: str) -> None:
    rayservice = the(rendered(overlay), "RayService")
    for node, params in start_params(rayservice).items():
        fixed = {k: int(v) for k, v in params.items() if k in FIXED_PORTS}
        assert fixed == FIXED_PORTS, node
        for option in DEFAULT_PORTS:
            assert option not in params, f"{node}: {option} is set; update the policies"
    # The head's containerPorts name the two defaults the policies rely on.
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in head["containers"][0]["ports"]}
    assert ports["gcs-server"] == GCS and ports["dashboard"] == DASHBOARD


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tool_workers_reach_the_head_only_on_the_ports_a_ray_worker_needs(overlay: str) -> None:
    """Issue #39: what a tool-worker pod (and any worker pod) may open on the head is exactly
    GCS, raylet, object manager and the worker ports; never the dashboard (8265, jobs API), the
    dashboard agent (52365, a job API too), the other agents, the client port or Serve's."""
    objects = rendered(overlay)
    labels = pod_labels(the(objects, "RayService"))
    expected = set().union(*(ports for ports, _ in HEAD_PORTS_FOR_WORKERS.values()))
    head = labels["head"]
    tools = labels[TOOL_GROUP]
    assert reachable(objects, tools, head) == expected
    for name, pod in labels.items():
        if name == "head":
            continue
        assert reachable(objects, pod, head) == expected, name
        assert DASHBOARD not in reachable(objects, pod, head), name
        assert AGENT_HTTP not in reachable(objects, pod, head), name
        # Worker to worker: no GCS there, and no agent either.
        for other_name, other in labels.items():
            if other_name != "head":
                assert reachable(objects, pod, other) == WORKER_PORTS_FOR_RAY_PODS, other_name
    # The head's dashboard reaches every node's agents; nothing else does.
    for name, pod in labels.items():
        if name != "head":
            assert reachable(objects, head, pod) == WORKER_PORTS_FOR_RAY_PODS | AGENTS, name


def test_the_ports_and_their_reasons_are_documented() -> None:
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Ray's ports", 1)[1].split("\n## ", 1)[0]
    for port in (GCS, RAYLET, OBJECT_MANAGER, *sorted(AGENTS), DASHBOARD, 10001):
        assert str(port) in section, port
    assert "10002-19999" in section


# ---------------------------------------------------------------------------------------------
# the head's egress out of the namespace; image digests; pin_overlay.py

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_head_leaves_the_namespace_and_only_for_the_api_server(overlay: str) -> None:
    objects = rendered(overlay)
    blocks = []
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            for peer in rule["to"]:
                if "ipBlock" not in peer:
                    continue
                assert policy["metadata"]["name"] == "ooo-spec-head-egress-kube-api"
                assert policy["spec"]["podSelector"]["matchLabels"]["ray.io/node-type"] == "head"
                assert {p["port"] for p in rule["ports"]} == {443, 6443}
                network = ipaddress.ip_network(peer["ipBlock"]["cidr"])
                assert network.num_addresses == 1, "one address, never a range"
                blocks.append(str(network))
    # Unpinned, the overlay names the placeholder, which reaches nothing.
    assert blocks == [pin.PLACEHOLDER_API_SERVER]
    shipped = (K8S / "overlays" / overlay / pin.API_SERVER_PATCH).read_text(encoding="utf-8")
    assert shipped == pin.api_server_patch([pin.PLACEHOLDER_API_SERVER]), "not what pin writes"


def images(objects: list[Obj]) -> dict[str, str]:
    found = {}
    for where, template in pod_templates(objects):
        for container in template["spec"]["containers"] + template["spec"].get(
            "initContainers", []
        ):
            found[f"{where}/{container['name']}"] = container["image"]
    autoscaler = the(objects, "RayService")["spec"]["rayClusterConfig"]["autoscalerOptions"]
    if "image" in autoscaler:
        found["autoscaler"] = autoscaler["image"]
    return found


def test_gpu_overlay_runs_every_image_by_digest() -> None:
    """Every container of the GPU overlay, Jaeger's included, is pulled by digest (the
    autoscaler sidecar runs the Ray container's image). Unpinned, the digests are the zero
    placeholder, which no registry serves: nothing runs a tag's bytes of the day by accident."""
    for where, image in images(rendered(GPU_OVERLAY)).items():
        assert DIGEST.search(image), f"{where}: {image} is not pinned by digest"
        assert ":" in image.rsplit("/", 1)[-1].split("@")[0], f"{where}: keep the tag for people"


def _copy_k8s(tmp_path: Path) -> Path:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root)
    return root


def test_pin_overlay_fills_digests_and_api_server_and_check_refuses_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overlay = _copy_k8s(tmp_path) / "overlays" / GPU_OVERLAY
    assert pin.main([str(overlay), "--check"]) == 1
    before = (overlay / "kustomization.yaml").read_text(encoding="utf-8")
    ray_digest, jaeger_digest = "sha256:" + "ab" * 32, "sha256:" + "cd" * 32
    assert pin.main([
        str(overlay),
        "--digest", f"ooo-spec={ray_digest}",
        "--digest", f"cr.jaegertracing.io/jaegertracing/jaeger={jaeger_digest}",
        "--api-server", "10.0.0.2 10.0.0.3", "--api-server", "10.96.0.1",
        "--check",
    ]) == 0
    after = (overlay / "kustomization.yaml").read_text(encoding="utf-8")
    # Only the digest lines changed; comments and everything else stay.
    pairs = zip(before.splitlines(), after.splitlines(), strict=True)
    changed = [(a, b) for a, b in pairs if a != b]
    assert len(changed) == 2 and all("digest:" in a for a, _ in changed)
    objects = kustomize.render(overlay)
    found = images(objects)
    assert found["RayService/main/ray-worker"] == (
        f"registry.example.com/ooo-spec:0.1.0-gpu@{ray_digest}"
    )
    assert found["Deployment/jaeger/jaeger"].endswith(f":2.15.0@{jaeger_digest}")
    policy = the(objects, "NetworkPolicy", "ooo-spec-head-egress-kube-api")
    cidrs = [peer["ipBlock"]["cidr"] for peer in policy["spec"]["egress"][0]["to"]]
    assert cidrs == ["10.0.0.2/32", "10.0.0.3/32", "10.96.0.1/32"]

    # Refused: ranges, the metadata endpoint's range, bad digests, unknown images.
    for bad in (
        ["--api-server", "0.0.0.0/0"],
        ["--api-server", "169.254.169.254"],
        ["--api-server", "10.0.0.0/8"],
        ["--api-server", "api.example.com"],
        ["--digest", "ooo-spec=sha256:1234"],
        ["--digest", "nginx=" + ray_digest],
    ):
        assert pin.main([str(overlay), *bad]) == 2, bad
    assert "pin_overlay:" in capsys.readouterr().err
    # The CPU overlay (images loaded into kind by tag) has no digest line to fill.
    assert pin.main([str(overlay.parent / "cpu-dev"), "--digest", f"ooo-spec={ray_digest}"]) == 2


# ---------------------------------------------------------------------------------------------
# Pod Security Admission

PSA_PREFIX = "pod-security.kubernetes.io/"
# The restricted profile's allowed volume types (Pod Security Standards, Kubernetes 1.30).
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}


def restricted_violations(pod: Obj, extra: list[Obj] | None = None) -> list[str]:
    """What in `pod` (a pod spec) the `restricted` Pod Security Standard refuses; `extra`
    containers are those KubeRay adds to it (the autoscaler sidecar)."""
    problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)}")
    pod_context = pod.get("securityContext", {})
    if pod_context.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for container in [*pod["containers"], *pod.get("initContainers", []), *(extra or [])]:
        name = container.get("name", "?")
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot unset")
        if context.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities not dropped")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespace_enforces_pod_security_restricted_and_every_pod_passes(overlay: str) -> None:
    objects = rendered(overlay)
    spec = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
    namespace = the(objects, "Namespace")
    assert namespace["metadata"]["name"] == spec["namespace"]
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[PSA_PREFIX + mode] == "restricted", mode
    # Enforce a fixed version of the profile (the one the tests validate against).
    assert labels[PSA_PREFIX + "enforce-version"] == "v1.30"
    cluster = the(objects, "RayService")["spec"]["rayClusterConfig"]
    autoscaler = {"name": "autoscaler", **cluster["autoscalerOptions"]}
    for where, template in pod_templates(objects):
        extra = [autoscaler] if where == "RayService/head" else []
        assert restricted_violations(template["spec"], extra) == [], where


def test_the_restricted_check_catches_what_the_profile_refuses() -> None:
    pod = rendered(GPU_OVERLAY)
    template = dict(pod_templates(pod))["RayService/cpu"]["spec"]
    assert restricted_violations(template) == []
    container = template["containers"][0]["securityContext"]
    for key, value in (("allowPrivilegeEscalation", True), ("privileged", True),
                       ("capabilities", {"add": ["SYS_ADMIN"], "drop": ["ALL"]})):
        broken = json.loads(json.dumps(template))
        broken["containers"][0]["securityContext"] = {**container, key: value}
        assert restricted_violations(broken), key
    broken = json.loads(json.dumps(template))
    broken["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    del broken["securityContext"]["seccompProfile"]
    assert len(restricted_violations(broken)) == 2


# ---------------------------------------------------------------------------------------------
# read-only pods that start (issue #44): every cache on a writable volume

# Every variable through which a library of the image chooses where it writes at run time, read
# from each library's source (vllm/envs.py, flashinfer/jit/env.py, triton's knobs,
# torch/_inductor, huggingface_hub/constants.py, transformers/utils/hub.py, numba, vLLM's
# outlines backend), with what goes there. base/runtime.yaml sets each one.
WRITABLE_VARIABLES = {
    "HOME": "anything written under ~ without a variable of its own (CUDA, Triton, FlashInfer)",
    "XDG_CACHE_HOME": "the default cache root of vLLM, huggingface_hub and others",
    "XDG_CONFIG_HOME": "the default config root (vLLM's usage-stats file)",
    "HF_HOME": "huggingface_hub: token, stored tokens",
    "HF_ASSETS_CACHE": "huggingface_hub: assets",
    "HF_XET_CACHE": "huggingface_hub: Xet chunk cache",
    "HF_MODULES_CACHE": "transformers: remote-code modules",
    "VLLM_CACHE_ROOT": "vLLM: torch.compile cache, FlashInfer autotune results",
    "VLLM_CONFIG_ROOT": "vLLM: usage-stats config",
    "VLLM_ASSETS_CACHE": "vLLM: downloaded assets",
    "FLASHINFER_WORKSPACE_BASE": "FlashInfer: JIT-compiled kernels, cubins (.cache/flashinfer)",
    "TRITON_HOME": "Triton: dump and override folders",
    "TRITON_CACHE_DIR": "Triton: compiled kernels",
    "TORCHINDUCTOR_CACHE_DIR": "torch.compile (inductor) artifacts",
    "TORCH_EXTENSIONS_DIR": "torch C++/CUDA extensions built at run time",
    "TORCH_HOME": "torch hub",
    "CUDA_CACHE_PATH": "CUDA's PTX JIT cache",
    "NUMBA_CACHE_DIR": "numba's compiled functions",
    "OUTLINES_CACHE_DIR": "vLLM's outlines backend disk cache",
}
# Read from the image, never written: they must not be hidden under a volume.
READ_ONLY_VARIABLES = {
    "HF_HUB_CACHE": "the models baked into the image, read offline (HF_HUB_OFFLINE=1)",
    "OOO_SPEC_HOME": "the embedded model prepared at build time (CPU image)",
}
# Older names that would override the ones above if a library still read them.
UNSET_VARIABLES = {"TRANSFORMERS_CACHE", "HUGGINGFACE_HUB_CACHE", "PYTORCH_TRANSFORMERS_CACHE"}


def writable_mounts(pod: Obj, container: Obj) -> list[str]:
    """Mount paths in `container` of volumes it may write: emptyDir or PVC, not read-only."""
    kinds = {v["name"]: v for v in pod.get("volumes", [])}
    paths = []
    for mount in container.get("volumeMounts", []):
        volume = kinds.get(mount["name"], {})
        if ("emptyDir" in volume or "persistentVolumeClaim" in volume) and not mount.get(
            "readOnly"
        ):
            paths.append(mount["mountPath"])
    return paths


def all_mounts(container: Obj) -> list[str]:
    return [m["mountPath"] for m in container.get("volumeMounts", [])]


def under(path: str, roots: list[str]) -> bool:
    normal = posixpath.normpath(path)
    return posixpath.isabs(path) and any(
        normal == root or normal.startswith(root.rstrip("/") + "/") for root in roots
    )


def ray_pods(objects: list[Obj]) -> list[tuple[str, Obj, Obj]]:
    """(group, pod spec, Ray container) of the head and every worker group."""
    rayservice = the(objects, "RayService")
    specs = {"head": rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]}
    specs.update({n: g["template"]["spec"] for n, g in groups(rayservice).items()})
    return [(name, specs[name], container) for name, container in ray_containers(rayservice)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_cache_variable_points_under_a_writable_volume(overlay: str) -> None:
    """Issue #44: with a read-only root filesystem, every cache a library writes must be on a
    writable volume of its container, or the pod fails at start (FlashInfer's JIT cache under
    ~/.cache/flashinfer was not)."""
    objects = rendered(overlay)
    runtime = the(objects, "ConfigMap", "ooo-spec-runtime")["data"]
    assert set(WRITABLE_VARIABLES) | set(READ_ONLY_VARIABLES) <= set(runtime)
    for group, pod, container in ray_pods(objects):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, group
        env = container_env(objects, container)
        writable = writable_mounts(pod, container)
        for variable in WRITABLE_VARIABLES:
            assert variable in env, f"{group}: {variable} unset"
            assert under(env[variable], writable), f"{group}: {variable}={env[variable]}"
        for variable in READ_ONLY_VARIABLES:
            assert not under(env[variable], all_mounts(container)), (
                f"{group}: {variable} is under a volume, which hides the image's files"
            )
        assert env["HF_HUB_OFFLINE"] == "1", group
        assert not UNSET_VARIABLES & set(env), group


def test_the_cache_check_catches_a_path_on_the_read_only_root() -> None:
    objects = rendered(GPU_OVERLAY)
    runtime = the(objects, "ConfigMap", "ooo-spec-runtime")["data"]
    _, pod, container = ray_pods(objects)[1]
    writable = writable_mounts(pod, container)
    assert under(runtime["FLASHINFER_WORKSPACE_BASE"], writable)
    # FlashInfer's default (the issue): under the image's home, read-only.
    assert not under("/home/ray", writable)
    assert not under("/tmpfoo/cache", writable) and not under("relative/tmp", writable)
    readonly = {**container, "volumeMounts": [
        {**m, "readOnly": True} for m in container["volumeMounts"]]}
    assert not under(runtime["VLLM_CACHE_ROOT"], writable_mounts(pod, readonly))


def _container_environment(overlay: str, group: str) -> tuple[dict[str, str], list[str]]:
    objects = rendered(overlay)
    for name, pod, container in ray_pods(objects):
        if name == group:
            env = {k: v for k, v in container_env(objects, container).items()
                   if isinstance(v, str)}
            return env, writable_mounts(pod, container)
    raise AssertionError(group)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_what_vllm_resolves_from_that_environment_is_writable(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path-valued variable vLLM knows (vllm/envs.py, evaluated by vLLM itself in the
    main group's environment, defaults included) is on a writable volume: a cache variable vLLM
    adds later that defaults under XDG_CACHE_HOME or ~ is covered without a change here."""
    envs = pytest.importorskip("vllm.envs")
    env, writable = _container_environment(overlay, "main")
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    checked = []
    for name, getter in envs.environment_variables.items():
        try:
            value = getter()
        except Exception:  # noqa: BLE001 - a variable that needs other settings is not a path
            continue
        if isinstance(value, str) and value.startswith("/"):
            assert under(value, writable), f"{name}={value}"
            checked.append(name)
    assert {"VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_ASSETS_CACHE"} <= set(checked)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_what_huggingface_hub_resolves_from_that_environment(overlay: str) -> None:
    """huggingface_hub computes its paths at import: ask a fresh interpreter with the main
    group's environment. Everything it writes is writable; the hub cache is the image's."""
    pytest.importorskip("huggingface_hub")
    env, writable = _container_environment(overlay, "main")
    code = (
        "import json, huggingface_hub.constants as c; print(json.dumps({k: getattr(c, k) for k"
        " in ('HF_HOME', 'HF_HUB_CACHE', 'HF_ASSETS_CACHE', 'HF_XET_CACHE', 'HF_TOKEN_PATH',"
        " 'HF_STORED_TOKENS_PATH', 'HF_HUB_OFFLINE')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
        check=True,
    ).stdout
    resolved: dict[str, Any] = json.loads(out)
    assert resolved.pop("HF_HUB_OFFLINE") is True
    assert resolved.pop("HF_HUB_CACHE") == env["HF_HUB_CACHE"]
    for name, value in resolved.items():
        assert under(value, writable), f"{name}={value}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tool_workers_can_write_the_demo_notes(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """append_note writes under $OOO_SPEC_HOME/notes, inside the image: the tool workers' pods
    mount a writable volume there (and only the path the app computes is checked)."""
    from app.tools.builtin import notes_path

    env, writable = _container_environment(overlay, TOOL_GROUP)
    monkeypatch.setenv("OOO_SPEC_HOME", env["OOO_SPEC_HOME"])
    assert under(str(notes_path("tenant-a")), writable)


# ---------------------------------------------------------------------------------------------
# no fixed key in the docs

_FIXED_KEY = [
    re.compile(r"api-keys=(?![\"']?\$)[^\s\"']+"),
    re.compile(r"OOO_SPEC_API_KEYS=(?![\"']?\$)[^\s\"'`]+"),
    re.compile(r"Bearer (?![\"']?[$<{])[A-Za-z0-9_\-]{8,}"),
]


def test_no_document_hands_out_a_fixed_api_key() -> None:
    """Issue #39: a key printed in the docs ends up on real clusters. Every key the docs
    create is generated on first use."""
    docs = [REPO_ROOT / "README.md", *REPO_ROOT.glob("docs/*.md"), *REPO_ROOT.glob("*/README.md"),
            *REPO_ROOT.glob("*/*/README.md")]
    assert K8S / "README.md" in docs
    for path in docs:
        text = path.read_text(encoding="utf-8")
        for pattern in _FIXED_KEY:
            found = pattern.findall(text)
            assert not found, f"{path.relative_to(REPO_ROOT)}: {found}"
    assert _FIXED_KEY[0].search("--from-literal=api-keys=dev-key-0123456789")
    assert not _FIXED_KEY[0].search('--from-literal=api-keys="$(openssl rand -hex 24)"')
