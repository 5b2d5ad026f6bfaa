"""`build_app(args)`: the Serve application from one validated `AppConfig`."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import load_config
from deployments.main_model import MainModel
from deployments.router import Router
from deployments.sidecar import Sidecar


def build_app(args: dict[str, Any] | None = None) -> Application:
    config = load_config(args)
    raw = config.model_dump(mode="json")
    main = MainModel.options(**config.main.deployment.serve_options()).bind(raw)
    sidecar = (
        Sidecar.options(**config.sidecar.deployment.serve_options()).bind(raw)
        if config.sidecar.enabled
        else None
    )
    return Router.options(**config.router.deployment.serve_options()).bind(raw, main, sidecar)
