"""Run the app on a local Ray (no cluster): used by `ooo-spec serve` and the test fixtures.

Reads a Ray Serve config file (the same schema KubeRay's serveConfigV2 takes), starts Ray with
the cores this machine has, starts Serve's HTTP proxy on the configured host/port and deploys
the config through Serve's declarative API (the one KubeRay uses), `deployments:` entries
included.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

READY_TIMEOUT_S = 600


def load_serve_config(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not data.get("applications"):
        raise ValueError(f"{path}: not a Ray Serve config (no 'applications')")
    return data


def base_url(serve_config: dict[str, Any]) -> str:
    http = serve_config.get("http_options") or {}
    return f"http://{http.get('host', '127.0.0.1')}:{http.get('port', 8000)}"


def start(
    serve_config: dict[str, Any],
    num_cpus: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
    metrics_export_port: int | None = None,
    dashboard_port: int | None = None,
) -> str:
    """Deploy every application of the config; return the base URL once /healthz answers.

    `env`: more environment for the replicas (e.g. OTEL_* for a trace receiver).
    `metrics_export_port`: where Ray's Prometheus endpoint listens (default: a free port Ray
    picks). `dashboard_port`: start Ray's dashboard there, on 127.0.0.1 (`serve status`, its
    Serve page and REST API, e.g. for load_tests/concurrency.py's replica counts); none by
    default. All three only apply when this call starts Ray."""
    import ray
    from ray import serve

    # Replicas import `app`/`deployments` from the working tree, like `serve run` does.
    root = str(Path(__file__).resolve().parent.parent)
    if not ray.is_initialized():
        ray.init(
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=dashboard_port is not None,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            runtime_env={"env_vars": {**_replica_env(root), **(env or {})}},
            _metrics_export_port=metrics_export_port,
            log_to_driver=os.environ.get("OOO_SPEC_RAY_LOGS", "0") == "1",
        )
    http = serve_config.get("http_options") or {}
    serve.start(http_options={"host": http.get("host", "127.0.0.1"),
                              "port": int(http.get("port", 8000))},
                proxy_location=serve_config.get("proxy_location", "HeadOnly"))
    deploy(serve_config)
    url = base_url(serve_config)
    wait_ready(url)
    return url


def deploy(serve_config: dict[str, Any]) -> None:
    """Apply the config's applications through Serve's declarative API, as `serve deploy` and
    KubeRay do: each `deployments:` entry is applied on top of what `build_app(args)` builds,
    to running replicas where Serve can (see deployments/app.py), and an application whose
    `args` changed is built again. Returns once the controller has taken the config."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(serve_config)
    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running: call start() first")
    client.deploy_apps(schema)


def _replica_env(root: str) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    # OOO_SPEC_API_KEYS: the router's keys (config `auth.api_keys_env`) reach it from here.
    for key in ("OOO_SPEC_HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE", "OOO_SPEC_API_KEYS"):
        if key in os.environ:
            env[key] = os.environ[key]
    # Tracing is configured by the standard OpenTelemetry variables (app/telemetry.py).
    env.update({k: v for k, v in os.environ.items() if k.startswith("OTEL_")})
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def wait_ready(url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status()
        apps = list(status.applications.values())
        if any(str(a.status).endswith("DEPLOY_FAILED") for a in apps):
            raise RuntimeError(f"deployment failed: {[a.message for a in apps]}")
        if apps and all(str(a.status).endswith("RUNNING") for a in apps):
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise TimeoutError(f"the app was not ready after {timeout_s:.0f} s")


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
