"""`build_app(args)`: the Serve application from one validated `AppConfig`.

`args` says what the app does; how each deployment runs (replicas, autoscaling,
`max_ongoing_requests`, `ray_actor_options`, graceful shutdown, health checks) comes from the
Serve config's `deployments:` entries, which Serve applies on top of the defaults below. Serve
changes those options on running replicas (only a new `ray_actor_options` restarts that
deployment's replicas), while any change to `args` changes every deployment's code version and
restarts them all.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment

from app.config import MAIN_NGRAM, MAIN_SUFFIX, ROUTER_MAX_ONGOING_REQUESTS, load_config
from app.engine.placement import engine_placement
from app.main_model.baselines import NGRAM, SUFFIX
from deployments.main_model import MainModel
from deployments.router import Router
from deployments.sidecar import Sidecar
from deployments.tool_worker import ToolWorker

# Options of a deployment that its `deployments:` entry does not set (Serve's own defaults
# otherwise). Engines: one CPU each (Ray sets OMP_NUM_THREADS to it). Router and tool workers
# mostly wait on the engines or on I/O: no CPU reserved.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "MainModel": {"max_ongoing_requests": 16, "ray_actor_options": {"num_cpus": 1}},
    "Sidecar": {"max_ongoing_requests": 16, "ray_actor_options": {"num_cpus": 1}},
    "Router": {"max_ongoing_requests": ROUTER_MAX_ONGOING_REQUESTS,
               "ray_actor_options": {"num_cpus": 0}},
    "ToolWorker": {
        "max_ongoing_requests": 16,
        "ray_actor_options": {"num_cpus": 0},
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4,
                               "target_ongoing_requests": 2},
    },
    # A second copy of the main model for comparisons only: no core reserved (on a 2-core box
    # main and sidecar hold both; benchmarks send one request at a time).
    MAIN_NGRAM: {"max_ongoing_requests": 16, "ray_actor_options": {"num_cpus": 0}},
    MAIN_SUFFIX: {"max_ongoing_requests": 16, "ray_actor_options": {"num_cpus": 0}},
}


def _deployment(cls: Any, name: str | None = None, tensor_parallel_size: int = 1) -> Deployment:
    # `@serve.deployment` has turned the class into a Deployment; mypy only sees the class.
    deployment: Deployment = cls
    if name is not None:
        deployment = deployment.options(name=name)
    options = dict(DEFAULT_OPTIONS[deployment.name])
    # A tensor-parallel engine's replica holds all its GPUs on one node. A `deployments:` entry
    # that sets `ray_actor_options` must set this placement too (`ooo-spec config check` says
    # what): Serve requires the actor's options to fit in the first bundle.
    placement = engine_placement(tensor_parallel_size, options["ray_actor_options"])
    if placement is not None:
        options["ray_actor_options"] = {
            **options["ray_actor_options"], "num_gpus": placement.num_gpus,
        }
        options["placement_group_bundles"] = placement.placement_group_bundles
        options["placement_group_strategy"] = placement.placement_group_strategy
    return deployment.options(**options)


def build_app(args: dict[str, Any] | None = None) -> Application:
    config = load_config(args)
    # Every deployment but the router gets the config without `auth`: API keys reach the
    # router only (and stay out of the engines' logs and errors).
    shared = config.model_dump(mode="json", exclude={"auth"})
    sidecar = (
        _deployment(Sidecar, None, config.sidecar.engine.tensor_parallel_size).bind(shared)
        if config.sidecar.enabled
        else None
    )
    # The main replicas call the sidecar themselves, beside their prefill (main_model.py).
    main = _deployment(MainModel, None, config.main.engine.tensor_parallel_size).bind(
        shared, None, sidecar)
    tool_worker = _deployment(ToolWorker).bind(shared)
    # The same deployment class under its own name, so it scales and is placed on its own.
    main_ngram = (
        _deployment(
            MainModel, MAIN_NGRAM,
            (config.baselines.ngram.engine or config.main.engine).tensor_parallel_size,
        ).bind(shared, NGRAM)
        if config.baselines.ngram.enabled
        else None
    )
    main_suffix = (
        _deployment(MainModel, MAIN_SUFFIX).bind(shared, SUFFIX)
        if config.baselines.suffix.enabled
        else None
    )
    # The router validates `args` itself; a dump would print its SecretStr keys as stars.
    return _deployment(Router).bind(dict(args or {}), main, sidecar, tool_worker, main_ngram,
                                    main_suffix)
