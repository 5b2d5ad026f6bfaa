"""`build_app(args)`: the Serve application from one validated `AppConfig`."""

from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment

from app.config import DeploymentOptions, load_config
from app.engine.baselines import NGRAM
from deployments.main_model import MainModel
from deployments.router import Router
from deployments.sidecar import Sidecar
from deployments.tool_worker import ToolWorker


def _deployment(cls: Any, options: DeploymentOptions) -> Deployment:
    # `@serve.deployment` has turned the class into a Deployment; mypy only sees the class.
    deployment: Deployment = cls
    return deployment.options(**options.serve_options())


def build_app(args: dict[str, Any] | None = None) -> Application:
    config = load_config(args)
    raw = config.model_dump(mode="json")
    main = _deployment(MainModel, config.main.deployment).bind(raw)
    sidecar = (
        _deployment(Sidecar, config.sidecar.deployment).bind(raw)
        if config.sidecar.enabled
        else None
    )
    tool_worker = _deployment(ToolWorker, config.tool_worker.deployment).bind(raw)
    ngram = config.baselines.ngram
    # The same deployment class under its own name, so it scales and is placed on its own.
    main_ngram = (
        _deployment(MainModel, ngram.deployment).options(name="MainModelNgram").bind(raw, NGRAM)
        if ngram.enabled
        else None
    )
    return _deployment(Router, config.router.deployment).bind(
        raw, main, sidecar, tool_worker, main_ngram
    )
