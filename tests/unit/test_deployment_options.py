"""What `build_app` hands each deployment (issues #14, #20): API keys reach the router only and
are hidden in dumps; deployment options are code defaults that a Serve config's `deployments:`
entries override, never part of `args`."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.config import AppConfig, load_config
from deployments.app import DEFAULT_OPTIONS, build_app

KEY = "secret-key-0123456789"


def bound(application: Any) -> dict[str, tuple[Any, ...]]:
    """Deployment name -> its constructor arguments, for the router and what it is bound to."""
    router = application._bound_deployment
    found = {router.name: router.init_args}
    for child in router.init_args[1:]:
        if child is not None:
            found[child._bound_deployment.name] = child._bound_deployment.init_args
    return found


def test_api_keys_reach_the_router_only() -> None:
    args = {"auth": {"api_keys": [KEY]}, "baselines": {"ngram": {"enabled": True}}}
    deployments = bound(build_app(args))
    assert set(deployments) == set(load_config(args).deployment_names())
    assert load_config(deployments["Router"][0]).auth.api_keys[0].key.get_secret_value() == KEY
    for name, init_args in deployments.items():
        if name != "Router":
            assert "auth" not in init_args[0], name
            assert KEY not in repr(init_args), name


def test_keys_are_hidden_in_dumps_and_reprs() -> None:
    config = load_config({"auth": {"api_keys": [{"key": KEY, "name": "ci"}]}})
    assert KEY not in repr(config) and KEY not in str(config.model_dump(mode="json"))
    assert KEY not in config.model_dump_json()
    with pytest.raises(ValidationError):
        load_config({"auth": {"api_keys": ["short"]}})


def test_deployment_options_are_not_app_config() -> None:
    with pytest.raises(ValidationError, match="deployment"):
        load_config({"main": {"deployment": {"max_ongoing_requests": 8}}})
    # Every deployment the app can build has code defaults for what an entry leaves unset.
    everything = AppConfig.model_validate(
        {"baselines": {"ngram": {"enabled": True}, "suffix": {"enabled": True}}})
    assert set(everything.deployment_names()) == set(DEFAULT_OPTIONS)
    for name, options in bound_options(everything).items():
        assert options == DEFAULT_OPTIONS[name]["max_ongoing_requests"], name


def bound_options(config: AppConfig) -> dict[str, int]:
    application = build_app(config.model_dump(mode="json"))
    router = application._bound_deployment
    found = {router.name: router._deployment_config.max_ongoing_requests}
    for child in router.init_args[1:]:
        if child is not None:
            deployment = child._bound_deployment
            found[deployment.name] = deployment._deployment_config.max_ongoing_requests
    return found


def test_a_tensor_parallel_engine_gets_its_placement_by_default() -> None:
    """app/engine/placement.py: the code default of a TP engine's deployment reserves its
    GPUs in one STRICT_PACK bundle (a `deployments:` entry replaces it; config check says how)."""
    config = AppConfig.model_validate({"main": {"engine": {"tensor_parallel_size": 2}}})
    application = build_app(config.model_dump(mode="json"))
    replicas = {
        child._bound_deployment.name: child._bound_deployment._replica_config
        for child in application._bound_deployment.init_args[1:] if child is not None
    }
    main = replicas["MainModel"]
    assert main.ray_actor_options["num_gpus"] == 2
    assert main.placement_group_bundles == [{"CPU": 1.0, "GPU": 2.0}]
    assert main.placement_group_strategy == "STRICT_PACK"
    assert replicas["Sidecar"].placement_group_bundles is None
