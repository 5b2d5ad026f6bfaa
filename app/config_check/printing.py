"""Printing: the report as text (`ooo-spec config check`) or JSON (`--json`)."""

from __future__ import annotations

import json

from app.config_check.report import ConfigReport


def format_report(report: ConfigReport) -> str:
    lines: list[str] = []
    for app in report.applications:
        lines.append(f"{report.source}: application {app.name}")
        for error in app.errors:
            lines.append(f"  ERROR {error}")
        for dep in app.deployments:
            where = dep.platform or "no engine"
            gpu = f" on {dep.gpu_type} ({dep.gpu_memory_gib} GiB)" if dep.gpu_memory_gib else ""
            lines.append(f"  {dep.name}: {where}{gpu}; actor {dep.actor} (from {dep.actor_from})")
            if dep.engine_args is not None:
                lines.append(f"    model {dep.model}; dims from {dep.model_dims_from}")
                lines.append(f"    engine args: {json.dumps(dep.engine_args, sort_keys=True)}")
                if dep.speculative_config is not None:
                    spec = json.dumps(dep.speculative_config, sort_keys=True)
                    lines.append(f"    speculative_config: {spec}")
                if dep.placement is not None:
                    place = json.dumps(dep.placement.model_dump(), sort_keys=True)
                    lines.append(f"    placement (tensor parallel {dep.tensor_parallel_size}): "
                                 f"{place}")
                if dep.max_model_len_limit is not None:
                    lines.append(f"    model's max length: {dep.max_model_len_limit} "
                                 f"({dep.max_model_len_from})")
                env = " ".join(f"{k}={v}" for k, v in sorted((dep.env or {}).items()))
                unset = f"; unset {' '.join(dep.env_unset)}" if dep.env_unset else ""
                lines.append(f"    env: {env}{unset}")
            if dep.kv_cache is not None:
                kv = dep.kv_cache
                verdict = "fits" if kv.fits else "DOES NOT FIT"
                lines.append(
                    f"    KV cache: {kv.bytes_per_token} B/token; one max_model_len request "
                    f"{kv.request_gib:.2f} GiB; cache {kv.cache_gib:.2f} GiB ({kv.cache_from}): "
                    f"{verdict}, {kv.full_length_requests:.1f} full-length requests"
                )
            if dep.tool_format is not None:
                lines.append(f"    tool format: {dep.tool_format}")
            if dep.forced_calls is not None:
                lines.append(f"    forced calls: {dep.forced_calls}")
            for warning in dep.warnings:
                lines.append(f"    WARNING {warning}")
            for error in dep.errors:
                lines.append(f"    ERROR {error}")
    errors = report.errors
    lines.append("OK" if not errors else f"{len(errors)} error(s): this config cannot start")
    return "\n".join(lines)


def report_json(report: ConfigReport) -> str:
    payload = report.model_dump(mode="json")
    payload["ok"] = report.ok
    payload["errors"] = report.errors
    return json.dumps(payload, indent=2, sort_keys=True)

