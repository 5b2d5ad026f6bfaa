"""Reach into the test app's Ray cluster from the test process (the driver that started it):
deployment handles, replica actors to kill, engine counters, and side applications.

A side application is one more Router (and, if asked, its own ToolWorker) with a different
config, deployed beside the session app and bound to that app's MainModel and Sidecar. It costs
no CPU reservation and no extra engine, so auth, deadline and privacy settings can be tested on
real deployments while the session app keeps its default config. (A test that needs an engine
the session app lacks, the n-gram baseline's, binds its own and pays for its start.)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
# The tool modules of the tests' apps: the built-in tools and the bench's slow_lookup
# (load_tests/bench_tools.py, as in configs/bench.yaml), which the tool tests pre-execute.
TOOL_MODULES = ("app.tools.builtin", "load_tests.bench_tools")
APP = "ooo-spec"  # the application name in configs/local.yaml
MODEL = "smollm2-135m-instruct"
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
GOOD = {"messages": [{"role": "user", "content": "Look up 'alpha'."}], "tools": [TOOL],
        "tool_choice": "required", "temperature": 0, "max_tokens": 32}


def handle(deployment: str, app: str = APP) -> Any:
    from ray import serve

    return serve.get_deployment_handle(deployment, app_name=app)


def call(deployment: str, method: str, *args: Any, app: str = APP, **kwargs: Any) -> Any:
    """One handle call from the driver, answered within 30 s."""
    return getattr(handle(deployment, app), method).remote(*args, **kwargs).result(
        timeout_s=30)


def counters(deployment: str) -> dict[str, int]:
    """The engine's leak counters (`VllmEngine.counters`) of MainModel or Sidecar."""
    result: dict[str, int] = call(deployment, "engine_counters")
    return result


def idle(c: dict[str, int]) -> bool:
    return c["unfinished"] == 0 and c["streams"] == 0 and c["store"] == 0


def replica_names(deployment: str, app: str = APP) -> list[str]:
    import ray

    marker = f"SERVE_REPLICA::{app}#{deployment}#"
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(marker)]


def kill_replica(deployment: str, app: str = APP) -> str:
    """Kill the deployment's only replica the hard way (like a crashed process); Serve
    notices and starts a new one."""
    import ray

    names = replica_names(deployment, app)
    assert len(names) == 1, f"expected one {deployment} replica, found {names}"
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


def wait_for(what: str, check: Callable[[], Any], timeout_s: float,
             every_s: float = 0.5) -> Any:
    """Poll `check` until it returns something truthy; errors count as not yet."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - a replica restarting answers with errors
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def replaced(deployment: str, old: str, timeout_s: float = 300) -> None:
    """Wait until Serve runs a new, healthy replica of `deployment` instead of `old`."""
    from ray import serve

    def ready() -> bool:
        names = replica_names(deployment)
        status = serve.status().applications[APP].deployments[deployment]
        return (bool(names) and old not in names and str(status.status).endswith("HEALTHY")
                and not str(status.status).endswith("UNHEALTHY"))

    wait_for(f"a new {deployment} replica", ready, timeout_s, every_s=1)


def chat(url: str, body: dict[str, Any], timeout: float = 180,
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout,
                      headers=headers)


def serves_normally(url: str, timeout_s: float = 300) -> dict[str, Any]:
    """Wait until a plain good request is answered 200 with a tool call; return it."""
    def ok() -> dict[str, Any] | None:
        r = chat(url, GOOD, timeout=120)
        if r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"]:
            result: dict[str, Any] = r.json()
            return result
        return None

    result: dict[str, Any] = wait_for("a normal request served", ok, timeout_s, every_s=2)
    return result


def local_args() -> dict[str, Any]:
    from deployments.local import load_serve_config

    config = load_serve_config(ROOT / "configs" / "local.yaml")
    args: dict[str, Any] = copy.deepcopy(config["applications"][0]["args"])
    args["tools"] = list(TOOL_MODULES)  # as the session app's (tests/conftest.py)
    args["speculation"]["sidecar_value"] = {"enabled": False}  # as the session app's
    return args


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def deploy_side_app(
    name: str,
    base_url: str,
    overrides: dict[str, Any],
    own_tool_worker: bool = False,
    env: dict[str, str] | None = None,
    main: Any = None,
    main_ngram: Any = None,
) -> str:
    """A Router with `overrides` on the local config, at `/<name>`; returns its base URL.
    `main`: a bound MainModel deployment of the side app's own instead of the session's;
    `main_ngram`: a bound n-gram baseline engine (the session app has none)."""
    from ray import serve

    from app.config import load_config
    from deployments.router import Router
    from deployments.tool_worker import ToolWorker

    # The args themselves, validated: a dump would print the SecretStr API keys as stars.
    raw = merge(local_args(), overrides)
    load_config(raw)
    if own_tool_worker:
        worker: Any = ToolWorker.options(  # type: ignore[attr-defined]
            num_replicas=1, ray_actor_options={"num_cpus": 0}).bind(raw)
    else:
        worker = handle("ToolWorker")
    actor: dict[str, Any] = {"num_cpus": 0}
    if env:
        actor["runtime_env"] = {"env_vars": dict(env)}
    router = Router.options(  # type: ignore[attr-defined]
        num_replicas=1, max_ongoing_requests=64, ray_actor_options=actor,
    ).bind(raw, main if main is not None else handle("MainModel"), handle("Sidecar"), worker,
           main_ngram)
    serve.run(router, name=name, route_prefix=f"/{name}", blocking=False)
    url = f"{base_url}/{name}"

    def up() -> bool:
        status = serve.status().applications.get(name)
        if status is not None and str(status.status).endswith("DEPLOY_FAILED"):
            raise RuntimeError(f"side app {name} failed: {status.message}")
        return (status is not None and str(status.status).endswith("RUNNING")
                and httpx.get(f"{url}/healthz", timeout=5).status_code == 200)

    wait_for(f"side app {name}", up, 600, every_s=1)
    return url


def delete_side_app(name: str) -> None:
    from ray import serve

    serve.delete(name, _blocking=True)


# --- what Serve runs (the tests that redeploy or autoscale the session app) --------------------


def serve_details(app: str = APP) -> dict[str, Any]:
    """Serve's own view of the application: status, deployments, replicas."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    assert client is not None
    details: dict[str, Any] = client.get_serve_details()["applications"][app]
    return details


def settled(app: str = APP) -> bool:
    """The app is RUNNING, every deployment HEALTHY, no replica starting or stopping."""
    details = serve_details(app)
    return details["status"] == "RUNNING" and all(
        d["status"] == "HEALTHY" and all(r["state"] == "RUNNING" for r in d["replicas"])
        for d in details["deployments"].values())
