"""The report `ooo-spec config check` fills: per application, per deployment (where it runs,
its engine arguments and environment, the KV cache), with warnings and errors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.config import Platform
from app.engine.placement import Placement


class KvCacheReport(BaseModel):
    bytes_per_token: int
    block_size: int
    request_gib: float = Field(description="One request of max_model_len tokens.")
    cache_gib: float
    cache_from: str
    fits: bool
    full_length_requests: float = Field(description="How many max_model_len requests fit.")


class DeploymentReport(BaseModel):
    name: str
    actor: dict[str, Any]
    actor_from: str
    platform: Platform | None = None  # None: no vLLM engine
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None
    model: str | None = None
    model_dims: dict[str, Any] | None = None
    model_dims_from: str | None = None
    engine_args: dict[str, Any] | None = None
    # vLLM's `speculative_config` of the engine (also in engine_args), shown on its own.
    speculative_config: dict[str, Any] | None = None
    tensor_parallel_size: int | None = None
    # The Serve placement a tensor-parallel engine needs (app/engine/placement.py).
    placement: Placement | None = None
    max_model_len_limit: int | None = None
    max_model_len_from: str | None = None
    env: dict[str, str] | None = None
    env_unset: list[str] = Field(default_factory=list)
    kv_cache: KvCacheReport | None = None
    # The main model: its tool format, how its prompt is built, and a warning when its chat
    # template writes calls in another dialect (None: the tokenizer is not local).
    tool_format: str | None = None
    # The main model: how forced and strict calls are constrained, in the model's own format
    # (a structural tag) or as the JSON fallback (app/formats/structural_tag.py).
    forced_calls: str | None = None
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class ApplicationReport(BaseModel):
    name: str
    deployments: list[DeploymentReport] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class ConfigReport(BaseModel):
    source: str
    applications: list[ApplicationReport] = Field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        out: list[str] = []
        for app in self.applications:
            out += [f"{app.name}: {e}" for e in app.errors]
            for dep in app.deployments:
                out += [f"{app.name}/{dep.name}: {e}" for e in dep.errors]
        return out

    @property
    def ok(self) -> bool:
        return not self.errors
