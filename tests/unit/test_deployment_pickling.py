"""Ray ships each deployment class to its replica with cloudpickle: whatever a deployment
module holds at module level must pickle (a ContextVar, a lock or a thread pool would not,
and the whole app would fail to deploy). In Serve's build worker the `deployments` package is
pickled by value, so the globals its methods name are pickled too (an object with a lock, such
as `prefix_index.ROUTING_LOG`, must be reached through its module): pickled here the same
way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray.cloudpickle as cloudpickle

import deployments
from deployments.main_model import MainModel
from deployments.router import Router
from deployments.sidecar import Sidecar
from deployments.tool_worker import ToolWorker


@pytest.mark.parametrize("deployment", [Router, MainModel, Sidecar, ToolWorker],
                         ids=lambda d: d.name)
def test_deployment_classes_pickle(deployment: object, by_value: None) -> None:
    cloudpickle.dumps(deployment.func_or_class)  # type: ignore[attr-defined]


@pytest.fixture()
def by_value() -> Iterator[None]:
    cloudpickle.register_pickle_by_value(deployments)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(deployments)
