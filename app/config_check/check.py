"""The entry: a file's Serve configs, each application's `args` validated with `AppConfig` and
every deployment checked (placement, engine, services), into one `ConfigReport`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.config import (
    MAIN_SUFFIX,
    ROUTER,
    ROUTER_MAX_ONGOING_REQUESTS,
    AppConfig,
    EngineConfig,
)
from app.config_check.engine import check_engine
from app.config_check.placement import (
    check_baseline_hardware,
    check_parallel,
    deployment_actor_options,
)
from app.config_check.reading import POOL_GPUS_KEY, serve_configs
from app.config_check.report import ApplicationReport, ConfigReport, DeploymentReport
from app.config_check.service_checks import check_tool_format, sidecar_adapter_errors
from app.engine.engine_args import custom_proposer_config
from app.engine.vllm_suffix import SUFFIX_MISSING, suffix_available


def check_file(path: str | Path) -> ConfigReport:
    text = Path(path).read_text(encoding="utf-8")
    return check_text(text, str(path))


def check_text(text: str, source: str) -> ConfigReport:
    report = ConfigReport(source=source)
    for serve_config in serve_configs(text, source):
        for index, application in enumerate(serve_config.get("applications") or []):
            report.applications.append(
                check_application(application, index, serve_config.get(POOL_GPUS_KEY))
            )
    return report


def _validation_messages(exc: ValidationError) -> list[str]:
    return [
        f"args.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
        for e in exc.errors()
    ]


def check_application(
    application: Mapping[str, Any],
    index: int = 0,
    pools: Mapping[str, tuple[str, int]] | None = None,
) -> ApplicationReport:
    """One application's report; `pools`: the GPUs per pod of the worker groups, by the pool
    resource each offers, when the config came from a RayService manifest."""
    report = ApplicationReport(name=str(application.get("name") or f"applications[{index}]"))
    try:
        config = AppConfig.model_validate(application.get("args") or {})
    except ValidationError as exc:
        report.errors += _validation_messages(exc)
        return report
    actors = deployment_actor_options(application, config)
    report.errors += router_capacity_errors(application, config)
    engines: dict[str, tuple[EngineConfig, str, dict[str, Any] | None]] = {
        "MainModel": (config.main.engine, "main.engine",
                      custom_proposer_config(config.speculation)),
    }
    if config.sidecar.enabled:
        # The sidecar's engine drafts the verifying pass over a call from its slots: it gets
        # the candidate proposer too (app/sidecar/service.py).
        engines["Sidecar"] = (config.sidecar.engine, "sidecar.engine",
                              custom_proposer_config(config.speculation))
    ngram = config.baselines.ngram
    if ngram.enabled:
        engines["MainModelNgram"] = (
            ngram.engine or config.main.engine,
            "baselines.ngram.engine" if ngram.engine else "main.engine",
            ngram.speculative_config(),
        )
    suffix = config.baselines.suffix
    if suffix.enabled:
        engines[MAIN_SUFFIX] = (
            suffix.engine or config.main.engine,
            "baselines.suffix.engine" if suffix.engine else "main.engine",
            suffix.speculative_config(),
        )
    pools = pools or {}
    for name, (actor, actor_from) in actors.items():
        dep = DeploymentReport(
            name=name, actor=actor.model_dump(exclude_none=True), actor_from=actor_from
        )
        if name in engines:
            cfg, setting, speculative = engines[name]
            check_engine(dep, actor, cfg, setting, speculative)
            check_parallel(dep, actor, cfg, setting, _entry(application, name), pools)
        if name == "MainModel":
            check_tool_format(dep, config.main.engine)
        if name == "Sidecar":
            dep.errors += sidecar_adapter_errors(config, _user_config(application, name))
        if name == MAIN_SUFFIX and not suffix_available():
            # A warning, not an error: the config may be checked away from the image it runs in.
            dep.warnings.append(SUFFIX_MISSING)
        report.deployments.append(dep)
    check_baseline_hardware(report, actors)
    return report


def router_capacity_errors(application: Mapping[str, Any], config: AppConfig) -> list[str]:
    """`auth.max_concurrent_anonymous` above what the Router deployment holds at once (its
    entry's `max_ongoing_requests`, else the code's default): past the router's capacity Serve
    queues requests where no limit answers them. The router clamps it at start; said here."""
    raw = _entry(application, ROUTER).get("max_ongoing_requests")
    capacity = raw if isinstance(raw, int) and raw > 0 else ROUTER_MAX_ONGOING_REQUESTS
    anonymous = config.auth.max_concurrent_anonymous
    if anonymous is None or anonymous <= capacity:
        return []
    return [f"args.auth.max_concurrent_anonymous is {anonymous}, above the Router deployment's "
            f"max_ongoing_requests ({capacity}): lower it (or unset it to use that number); "
            "the router would clamp it to that"]


def _entry(application: Mapping[str, Any], deployment: str) -> Mapping[str, Any]:
    for entry in application.get("deployments") or []:
        if isinstance(entry, Mapping) and entry.get("name") == deployment:
            return entry
    return {}


def _user_config(application: Mapping[str, Any], deployment: str) -> Any:
    return _entry(application, deployment).get("user_config")
