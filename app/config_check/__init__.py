"""`ooo-spec config check`: will this Serve config start? Answered before anything is deployed.

For every application of a Ray Serve config file (or of a RayService manifest's
`serveConfigV2`), the `args` are validated with `AppConfig`, and for every deployment this says
where it runs (actor options), which engine arguments and environment its vLLM engine gets
(`app/engine/engine_args.py`, the functions the replica itself calls) and whether the KV cache
holds one request of `max_model_len` tokens, which vLLM requires before it serves anything.

What else fails at start, checked here as vLLM checks it: a dtype the GPU cannot run, a
`max_model_len` beyond the model's own limit, weights absent while `HF_HUB_OFFLINE=1` (the pods'
setting), and a tensor-parallel engine whose replica does not hold its GPUs on one node
(app/engine/placement.py) or whose worker group's pods have fewer GPUs (read from a RayService
manifest's `rayClusterConfig`). One module per part (README.md); the names callers use are
re-exported here.
"""

from app.config_check.check import check_application, check_file, check_text, router_capacity_errors
from app.config_check.engine import check_engine
from app.config_check.memory import (
    DTYPE_BYTES,
    GIB,
    GPU_MEMORY_MIB,
    GPU_RESERVE_GIB,
    kv_bytes_for_request,
    kv_bytes_per_token,
)
from app.config_check.model_info import (
    EMBEDDED_MODEL_ID,
    KNOWN_MAX_LEN,
    KNOWN_MODELS,
    check_max_model_len,
    dims_from_config_json,
    model_dims,
    model_max_len,
)
from app.config_check.placement import (
    CODE_DEFAULT,
    ActorOptions,
    check_parallel,
    deployment_actor_options,
)
from app.config_check.platform_checks import (
    BF16_MIN_CAPABILITY,
    COMPUTE_CAPABILITY,
    WEIGHT_SUFFIXES,
    check_dtype,
    hub_offline,
    missing_weights,
)
from app.config_check.printing import format_report, report_json
from app.config_check.reading import POOL_GPUS_KEY, ConfigCheckError, pool_gpus, serve_configs
from app.config_check.report import (
    ApplicationReport,
    ConfigReport,
    DeploymentReport,
    KvCacheReport,
)
from app.config_check.service_checks import (
    THINKING_MODELS,
    check_tool_format,
    sidecar_adapter_errors,
)

__all__ = [
    "BF16_MIN_CAPABILITY",
    "CODE_DEFAULT",
    "COMPUTE_CAPABILITY",
    "DTYPE_BYTES",
    "EMBEDDED_MODEL_ID",
    "GIB",
    "GPU_MEMORY_MIB",
    "GPU_RESERVE_GIB",
    "KNOWN_MAX_LEN",
    "KNOWN_MODELS",
    "POOL_GPUS_KEY",
    "THINKING_MODELS",
    "WEIGHT_SUFFIXES",
    "ActorOptions",
    "ApplicationReport",
    "ConfigCheckError",
    "ConfigReport",
    "DeploymentReport",
    "KvCacheReport",
    "check_application",
    "check_dtype",
    "check_engine",
    "check_file",
    "check_max_model_len",
    "check_parallel",
    "check_text",
    "check_tool_format",
    "deployment_actor_options",
    "dims_from_config_json",
    "format_report",
    "hub_offline",
    "kv_bytes_for_request",
    "kv_bytes_per_token",
    "missing_weights",
    "model_dims",
    "model_max_len",
    "pool_gpus",
    "report_json",
    "router_capacity_errors",
    "sidecar_adapter_errors",
    "serve_configs",
]
