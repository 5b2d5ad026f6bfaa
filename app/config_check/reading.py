"""Reading the file: the Serve config(s) in a Serve config file or a RayService manifest, and
the GPUs per pod of a RayService's worker groups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml


class ConfigCheckError(Exception):
    """The file cannot be read as a Serve config at all."""


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
