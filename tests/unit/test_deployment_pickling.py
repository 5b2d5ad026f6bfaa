"""Ray ships each deployment class to its replica with cloudpickle: whatever a deployment
module holds at module level must pickle (a ContextVar, a lock or a thread pool would not,
and the whole app would fail to deploy)."""

from __future__ import annotations

import pytest
import ray.cloudpickle as cloudpickle

from deployments.main_model import MainModel
from deployments.router import Router
from deployments.sidecar import Sidecar
from deployments.tool_worker import ToolWorker


@pytest.mark.parametrize("deployment", [Router, MainModel, Sidecar, ToolWorker],
                         ids=lambda d: d.name)
def test_deployment_classes_pickle(deployment: object) -> None:
    cloudpickle.dumps(deployment.func_or_class)  # type: ignore[attr-defined]
