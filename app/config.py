"""The one configuration model of ooo-spec.

`configs/local.yaml` (Ray Serve config, `args:`) and the `serveConfigV2` inside the KubeRay
RayService both validate against `AppConfig`; `deployments.app:build_app(args)` is the only
place that turns it into deployments. Unknown keys are rejected so a typo never goes silent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from app.vllm_names import check_reasoning_parser, check_tool_parser

EMBEDDED_MODEL = "embedded"

# Where an engine runs, decided as vLLM decides it (`app/engine/cuda_driver.py`, `detect_platform`).
Platform = Literal["cpu", "cuda"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# How each deployment runs on Ray Serve (replicas, autoscaling, max_ongoing_requests,
# ray_actor_options, graceful shutdown, health checks) is not part of AppConfig: it lives in the
# Serve config's per-deployment `applications[].deployments[]` entries, which Serve applies in
# place. Serve hashes the whole `args` into every deployment's code version, so an option kept in
# `args` would restart every replica when it changed. deployments/app.py holds the defaults for
# what an entry leaves unset.

# The Router deployment's `max_ongoing_requests` unless its `deployments:` entry sets one
# (deployments/app.py): the anonymous concurrency cap never exceeds what the router holds.
ROUTER_MAX_ONGOING_REQUESTS = 64

# Serve deployment name of each part the config can deploy.
ROUTER, MAIN, SIDECAR, TOOL_WORKER, MAIN_NGRAM, MAIN_SUFFIX = (
    "Router", "MainModel", "Sidecar", "ToolWorker", "MainModelNgram", "MainModelSuffix"
)


# Model families and the tool-call and reasoning parsers vLLM's recipes run them with
# (`--tool-call-parser`, `--reasoning-parser`), most specific first: the first whose every
# word is in the model's name wins. Every name is one vLLM 0.32 registers
# (tests/unit/test_known_models.py).
KNOWN_MODELS: tuple[tuple[tuple[str, ...], str, str | None], ...] = (
    (("gpt-oss",), "openai", "openai_gptoss"),
    (("qwen3", "coder"), "qwen3_coder", None),
    (("qwen3.5",), "qwen3_coder", "qwen3"),
    (("qwen3.6",), "qwen3_coder", "qwen3"),
    (("qwen3",), "hermes", "qwen3"),
    (("qwen2.5",), "hermes", None),
    (("glm-4.5",), "glm45", "glm45"),
    (("glm-4.6",), "glm45", "glm45"),
    (("glm-4.7",), "glm47", "glm45"),
    (("kimi-k2",), "kimi_k2", "kimi_k2"),
    (("deepseek-v3.1",), "deepseek_v31", "deepseek_v3"),
    (("deepseek-v3.2",), "deepseek_v32", "deepseek_v3"),
    (("minimax-m2",), "minimax_m2", "minimax_m2_append_think"),
    (("magistral",), "mistral", "mistral"),
    (("devstral",), "mistral", None),
    (("mistral",), "mistral", None),
    (("ministral",), "mistral", None),
    (("llama-4",), "llama4_pythonic", None),
    (("llama-3",), "llama3_json", None),
    (("functiongemma",), "functiongemma", None),
    (("gemma-4",), "gemma4", "gemma4"),
)


def known_model_defaults(model: str) -> tuple[str, str | None] | None:
    """(tool_format, reasoning_parser) vLLM's recipes give the model's family, from its name
    (a Hugging Face id or a folder, its last part read case-blind); None: not a known family.

    >>> known_model_defaults("Qwen/Qwen3-8B")
    ('hermes', 'qwen3')
    >>> known_model_defaults("/models/Qwen3-Coder-30B-A3B-Instruct")
    ('qwen3_coder', None)
    >>> known_model_defaults("embedded") is None
    True
    """
    name = model.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    for words, tool_format, reasoning in KNOWN_MODELS:
        if all(w in name for w in words):
            return tool_format, reasoning
    return None


class ModelDims(_Strict):
    """What sizes a model's KV cache and weights (from its config.json)."""

    num_hidden_layers: int = Field(..., ge=1)
    num_key_value_heads: int = Field(..., ge=1)
    head_dim: int = Field(..., ge=1)
    num_parameters: float = Field(..., gt=0, description="Parameter count, e.g. 8.2e9.")


class EngineConfig(_Strict):
    """One vLLM engine (main model or sidecar)."""

    model: str = Field(
        EMBEDDED_MODEL,
        description="'embedded' (SmolLM2-135M prepared by `ooo-spec models prepare`), "
        "a local folder, or a model id already present in the image.",
    )
    served_model_name: str = "smollm2-135m-instruct"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    max_model_len: int = Field(2048, ge=128)
    max_num_seqs: int = Field(16, ge=1)
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="vLLM's scheduling policy. 'priority': a request's `priority` (lower "
        "first) orders the engine's queue; 'fcfs' (vLLM's default): a non-zero `priority` "
        "is a 400.",
    )
    log_stats: bool = Field(
        True,
        description="vLLM's per-step statistics as its `vllm:*` metrics on Ray's metrics "
        "endpoint (docs/observability.md); false turns them off.",
    )
    kv_cache_gib: float | None = Field(
        None, gt=0,
        description="KV cache size in GiB. CPU: None = 0.5 (whole GiB go through "
        "VLLM_CPU_KVCACHE_SPACE, less through kv_cache_memory_bytes). GPU: None = what "
        "`gpu_memory_utilization` leaves after weights and activations (vLLM profiles it); "
        "set it only to pin the cache (e.g. two engines sharing one GPU), as it then "
        "overrides `gpu_memory_utilization`.",
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1,
        description="GPU only: share of the GPU's memory this engine may take (weights, "
        "activations, KV cache). vLLM refuses to start when less than that is free.",
    )
    gpu_type: str | None = Field(
        None,
        description="GPU only: the GPU model the replicas run on, by Ray's accelerator names "
        "('H100', 'L4', 'A100-80G', ...), for `ooo-spec config check` to size the KV cache "
        "against its memory. Placement stays with the pool resources (an autoscaler cannot "
        "see Ray's accelerator_type on nodes that do not exist yet); None = the deployment's "
        "`accelerator_type`.",
    )
    model_dims: ModelDims | None = Field(
        None,
        description="The model's dimensions for `ooo-spec config check`, when its "
        "config.json is not local and the model is not in the check's table of known models.",
    )
    cpu_bind: str | None = Field(
        None,
        description="Cores for the engine's threads (VLLM_CPU_OMP_THREADS_BIND), e.g. '0'. "
        "None leaves threads to Ray's OMP_NUM_THREADS.",
    )
    block_size: int | None = Field(
        None, ge=16, multiple_of=16,
        description="KV cache block size; None = vLLM's default (128 on CPU). The prefix cache "
        "reuses whole blocks only, so an engine that sends many requests sharing a prompt "
        "(the sidecar's slots) recomputes up to one block of it per request: smaller is "
        "cheaper there.",
    )
    enforce_eager: bool = True
    batch_invariant: bool = Field(
        False,
        description="CUDA only: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1 in the "
        "engine's environment), so a token's logits no longer depend on how many tokens a "
        "pass computes; in bfloat16 that is what lets a verified draft and one-token decoding "
        "disagree on near-tied logits. vLLM calls the mode beta, needs compute capability 8.0 "
        "and costs speed (docs/speculation.md, 'Lossless, per platform').",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64,
        description="GPUs one replica's engine splits the model over (vLLM's tensor "
        "parallel, worker processes on one node; CUDA only). The replica must reserve that "
        "many GPUs: its Serve placement follows from it (app/engine/placement.py), and "
        "`ooo-spec config check` compares it with the deployment's options and, for a "
        "RayService manifest, with the GPUs of its worker group.",
    )
    tool_format: str = Field(
        "hermes",
        description="How the main model writes tool calls, by the name of vLLM's tool parser "
        "for the same dialect (`--tool-call-parser`; any of vLLM 0.32's, app/vllm_names.py): "
        "the fallback tool prompt for chat templates that ignore tools, how candidates are "
        "rendered, how outputs are parsed (app/formats/tool_formats/; docs/tool_formats.md).",
    )
    reasoning_parser: str | None = Field(
        None,
        description="Thinking models, by the name of vLLM's reasoning parser "
        "(`--reasoning-parser`; any of vLLM 0.32's): the reasoning is returned as the "
        "message's reasoning, never parsed as a call, and drafts start after it closes "
        "(app/formats/reasoning.py). None: no thinking.",
    )
    chat_template: str | None = Field(
        None,
        description="The main model's chat template, when not the tokenizer's own: a family "
        "name of the templates ooo-spec ships (qwen3_coder, openai, glm47, kimi_k2, ..., "
        "app/formats/templates/) or a path to a Jinja file. Prompts are rendered and calls "
        "drafted through it.",
    )

    @field_validator("tool_format")
    @classmethod
    def _known_tool_parser(cls, name: str) -> str:
        return check_tool_parser(name)

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        return check_reasoning_parser(name)
    tool_structural_tags: bool = Field(
        True,
        description="Constrain forced calls (`tool_choice: required`, a named tool) and "
        "`strict: true` tools in the model's own format with the structural tag vLLM and "
        "xgrammar keep for `tool_format` (app/formats/structural_tag.py), as `vllm serve` "
        "does; formats without one, or false here (vLLM's VLLM_ENFORCE_STRICT_TOOL_CALLING=0), "
        "force calls as a JSON list instead (app/formats/tool_format.py). `ooo-spec config "
        "check` says which applies.",
    )
    tool_strict_level: Literal["auto", "function", "parameter"] = Field(
        "auto",
        description="As vLLM's --tool-strict-level: when `tool_choice: auto` calls are "
        "constrained by the structural tag. auto: only when a tool is `strict: true` (its "
        "arguments pinned to its schema) or the client sent `parallel_tool_calls: false`; "
        "function: the call envelope (markers, tool names) of every request with tools; "
        "parameter: also every tool's arguments. Forced calls are always constrained, "
        "arguments included.",
    )

    @model_validator(mode="after")
    def _known_model_defaults(self) -> EngineConfig:
        """`tool_format` and `reasoning_parser` left unset: the ones vLLM's recipes give the
        model's family (`known_model_defaults`), where this version of the config accepts
        them."""
        known = known_model_defaults(self.model) or known_model_defaults(self.served_model_name)
        if known is None:
            return self
        for key, value in (("tool_format", known[0]), ("reasoning_parser", known[1])):
            if key in self.model_fields_set or value is None:
                continue
            try:
                self.__pydantic_validator__.validate_assignment(self, key, value)
            except ValueError:  # a name this config does not take (yet): keep the default
                continue
            self.model_fields_set.discard(key)  # still "not set by the user"
        return self


class LoadAwareConfig(_Strict):
    """How drafting gives way under load (app/drafting/draft_policy.py). Drafts never change the
    output, only how many tokens a forward pass may commit and what it costs."""

    step_draft_tokens: int | None = Field(
        None, ge=1,
        description="Draft tokens one engine step may verify in all, shared evenly among the "
        "running requests (each at most num_speculative_tokens, at least one). A full batch "
        "spends its compute on its requests' own tokens instead of on drafts. None: the "
        "engine's platform default (app/drafting/draft_policy.py PLATFORM_BUDGETS): 16 on CPU, "
        "where a verified draft token costs about a decoded one, so one user keeps the full "
        "num_speculative_tokens (16), four users 4 each, 15 users 1 each; 256 on GPU, "
        "where a decode step is memory-bound and drafts ride along nearly free.",
    )
    no_draft_batch: int | None = Field(
        None, ge=1,
        description="At this many running requests and more, nobody drafts. None: the "
        "platform default, 16 on CPU (a full batch of the CPU default's max_num_seqs), 128 "
        "on GPU.",
    )
    reject_streak: int = Field(
        4, ge=0,
        description="A request whose drafts were rejected whole this many steps in a row "
        "pauses drafting (0: never pauses).",
    )
    pause_steps: int = Field(4, ge=0, description="How many steps such a pause lasts.")
    sidecar_max_pending: int | None = Field(
        None, ge=1,
        description="The router skips the sidecar for a request while this many of its calls "
        "to the sidecar are pending (per router replica), since predictions queued behind "
        "them would reach the main model too late to draft (outcome sidecar_skipped, reason "
        "'busy'); the request then goes exactly as with the sidecar off (schema drafts, prompt "
        "lookup). None: never skip (a GPU "
        "sidecar batches its predictions nearly free). The CPU configs set 1: on the CPU "
        "default at 4 and 16 users most predictions arrived late (docs/benchmarks.md, "
        "'Under load').",
    )


class DraftWorthConfig(_Strict):
    """Drafts sized by what they are worth (app/drafting/draft_worth.py): each drafted position
    only while its chance of acceptance pays for verifying it. Never changes the output."""

    enabled: bool = Field(
        False, description="Cut each draft where the chance that all its tokens so far are "
        "accepted falls below the cost of verifying one more (off: every draft runs to its "
        "budget). Off by default: on this project's CPU engine, side by side at one commit, "
        "drafts run to the budget took fewer passes and as much or more throughput at 1, 4 "
        "and 16 agents (docs/benchmarks.md, 'Drafts sized by their worth, side by side').",
    )
    verify_cost_ratio: float | None = Field(
        None, gt=0, le=10,
        description="Cost of verifying one token over a forward pass's fixed cost (b / a). "
        "None: the platform's (0.04 on CPU, 0.002 on GPU), refined from the engine's own step "
        "times when `measure_steps` is on.",
    )
    measure_steps: bool = Field(
        True, description="Refine the ratio from the engine's decode steps (their time "
        "against the tokens each verified).",
    )
    max_spec_factor: float = Field(
        1.0, gt=0, le=16,
        description="The suffix source drafts at most this many tokens per token of context it "
        "matched (as vLLM's suffix decoding).",
    )


class HistoryConfig(_Strict):
    """Past committed calls offered as candidates at time zero (app/drafting/history.py)."""

    enabled: bool = True
    max_entries: int = Field(256, ge=1, description="Calls kept per main replica (memory only).")
    max_entries_per_tenant: int = Field(
        64, ge=1,
        description="Of those, what one tenant may hold (its oldest go first); when the total "
        "is full, the tenant holding the most loses its oldest, so no tenant can flush "
        "another's entries.",
    )
    min_similarity: float = Field(
        0.6, ge=0, le=1,
        description="Jaccard similarity of the last user message's words to a past one.",
    )
    private_tools: list[str] = Field(
        default_factory=list,
        description="Tools whose calls are never kept (their arguments may be personal data).",
    )


class SuffixConfig(_Strict):
    """The `suffix` draft source: each tenant's own earlier outputs and the request's own
    tokens, matched on their longest common suffix with the output (app/drafting/suffix_index.py).
    Memory: about 150 bytes per token per `max_depth`, per tenant."""

    enabled: bool = Field(
        True, description="Draft from the tenant's earlier outputs and the request's own "
        "tokens (per request: `ooo_spec.suffix`).",
    )
    max_depth: int = Field(
        16, ge=1, le=64,
        description="Longest context (tokens) a match may use; each output token is indexed "
        "this many times.",
    )
    min_match: int = Field(
        2, ge=1, description="Shortest context (tokens) a suffix draft may continue."
    )
    min_token_prob: float = Field(
        0.1, ge=0, le=1,
        description="A draft follows the most frequent continuation of the tenant's earlier "
        "outputs and stops where the chance of the whole draft (the product of each token's "
        "share of its context's count) falls below this; vLLM's "
        "`suffix_decoding_min_token_prob`, with its default.",
    )
    max_tokens_per_tenant: int = Field(
        8192, ge=16,
        description="Output tokens kept per tenant and main replica (memory only); the "
        "oldest outputs are evicted first.",
    )
    max_tenants: int = Field(
        64, ge=1,
        description="Tenants with an index per main replica; the least recently served "
        "tenant's index is dropped first.",
    )

    @model_validator(mode="after")
    def _match_fits_depth(self) -> SuffixConfig:
        if self.min_match > self.max_depth:
            raise ValueError("speculation.suffix.min_match must be <= max_depth")
        return self


class SidecarValueConfig(_Strict):
    """Skip the sidecar where it does not pay (app/api/sidecar_value.py): per tenant and tool
    set, its recent gain over the other draft sources against what a call costs."""

    enabled: bool = Field(
        True, description="Decide per tenant and tool set from the sidecar's measured gain; "
        "false: call it for every request that wants it.",
    )
    min_gain_tokens: float = Field(
        2.0, ge=0,
        description="Accepted draft tokens beyond the other sources' that one sidecar call "
        "must bring, on average, to be worth it (each saves at most one main forward pass; "
        "a call costs the sidecar's compute and, on a CPU, cores the main model decodes on).",
    )
    cost_per_pass: float = Field(
        0.0, ge=0, le=1,
        description="What a prediction in flight costs the main model, in main forward passes "
        "per pass of the turn: where the sidecar computes on the main model's cores (a CPU) "
        "each main pass runs slower while it predicts. A called turn's gain counts less this "
        "times its main passes. 0: the sidecar has accelerators of its own. The CPU configs "
        "set 0.15 (docs/benchmarks.md, 'The sidecar's worth in time').",
    )
    window: int = Field(4, ge=1, description="Recent sidecar calls the mean is taken over.")
    min_samples: int = Field(
        2, ge=1, description="Calls measured before the sidecar may be skipped (per tenant and "
        "tool set; a tool set not measured yet goes by the tenant's other tool sets once they "
        "hold this many)."
    )
    measure_new: bool = Field(
        True, description="A tool set with fewer than `min_samples` calls measured, of a tenant "
        "with as few over all its tool sets, calls the sidecar to measure it (`measuring`). "
        "False: it is skipped as one that does not pay and probed every `probe_every`-th "
        "request, so a new tenant pays no measuring calls where the sidecar costs the main "
        "model time (its prefill beside the main model's on the same cores). On this "
        "project's CPU, agents of two steps each: 1.04x the requests per second at one agent, "
        "the same at four (docs/benchmarks.md, 'Several agents, fair start'), so the CPU "
        "configs keep measuring.",
    )
    probe_every: int = Field(
        8, ge=1,
        description="While skipped, every this-many-th request calls the sidecar again to "
        "measure it anew.",
    )
    max_keys: int = Field(
        1024, ge=1, description="(tenant, tool set) records per router replica, and as many "
        "tenants' (LRU)."
    )


class SpeculationConfig(_Strict):
    num_speculative_tokens: int = Field(16, ge=1, le=64)
    prompt_lookup_fallback: bool = Field(
        True, description="Propose from the request's own tokens (vLLM's n-gram prompt "
        "lookup, source `lookup`); drafted where its drafts are expected to be accepted more "
        "than the other sources' (app/drafting/draft_choice.py).",
    )
    schema_drafts: bool = Field(
        True,
        description="Draft a forced call's keys and punctuation from the tool schema alone "
        "(ToolSpec-style) until the sidecar's candidate arrives.",
    )
    prompt_lookup_min: int = Field(2, ge=1)
    prompt_lookup_max: int = Field(4, ge=1)
    sidecar_timeout_s: float = Field(
        10.0, gt=0, description="After this the sidecar's answer is ignored (sidecar_late)."
    )
    sidecar_start_timeout_s: float = Field(
        3.0, gt=0,
        description="How long the main replica waits, beside its prefill, for its sidecar call "
        "to reach a sidecar replica (all busy, or one restarting) before it gives the "
        "prediction up (sidecar_error).",
    )
    history: HistoryConfig = Field(default_factory=lambda: HistoryConfig())
    suffix: SuffixConfig = Field(default_factory=lambda: SuffixConfig())
    sidecar_value: SidecarValueConfig = Field(default_factory=lambda: SidecarValueConfig())
    load_aware: LoadAwareConfig = Field(default_factory=lambda: LoadAwareConfig())
    draft_worth: DraftWorthConfig = Field(default_factory=lambda: DraftWorthConfig())


class SidecarLoraConfig(_Strict):
    """A LoRA adapter on the sidecar model (`ooo-spec sidecar distill` trains one from the
    main model's own calls, app/distill/), served through vLLM's LoRA support: every sidecar
    request carries it. The main model never sees it, so its output is unchanged."""

    path: str = Field(
        ..., min_length=1,
        description="Folder of the adapter in PEFT's format (adapter_config.json and "
        "adapter_model.safetensors), on every node a Sidecar replica may run on; "
        "`ooo-spec config check` says when it is missing here.",
    )
    max_rank: Literal[8, 16, 32, 64] = Field(
        16, description="vLLM's max_lora_rank: at least the adapter's rank (`r`)."
    )
    tool_choice: bool = Field(
        False,
        description="Whether the sidecar chooses the tool (when a request offers several) "
        "with the adapter too, or with its base model. Off: on held-out cases the adapter "
        "`ooo-spec sidecar distill` trained chose the main model's tool less often than the "
        "base model did (52% against 67%) while it filled arguments far more often like the "
        "main model (60% against 24%); app/distill/README.md.",
    )
    modules: Literal["adapter", "all"] = Field(
        "adapter",
        description="Layers vLLM wraps for LoRA: `adapter`, only the ones this adapter has "
        "weights for (on CPU every wrapped layer costs time on every token, whether the adapter "
        "uses it or not); `all`, every layer vLLM supports, so that an adapter swapped in "
        "later (`user_config.lora_path`) may cover other layers.",
    )

    def errors(self) -> list[str]:
        """The adapter must be there (on this machine) and its rank within `max_rank` (vLLM
        refuses it otherwise)."""
        import json
        from pathlib import Path

        config_file = Path(self.path) / "adapter_config.json"
        if not config_file.is_file():
            return [f"sidecar.lora.path: no adapter_config.json in {self.path} (train one with "
                    "`ooo-spec sidecar distill`)"]
        try:
            rank = int(json.loads(config_file.read_text(encoding="utf-8")).get("r", 0))
        except (ValueError, AttributeError):
            return [f"sidecar.lora.path: {config_file} is not a PEFT adapter config"]
        if rank > self.max_rank:
            return [f"sidecar.lora.max_rank: the adapter's rank is {rank}; set max_rank >= {rank}"]
        return []


class SidecarUserConfig(_Strict):
    """The Sidecar deployment's Serve `user_config`: what a redeploy changes on the running
    replicas (`reconfigure`), without restarting them or reloading the model."""

    lora_path: str | None = Field(
        None, min_length=1,
        description="Another adapter for `sidecar.lora` (same base model, rank within its "
        "max_rank); vLLM loads it beside the model. Needs `sidecar.lora` set at start: the "
        "engine is built with LoRA only then.",
    )


class SidecarConfig(_Strict):
    enabled: bool = True
    lora: SidecarLoraConfig | None = Field(
        None, description="The sidecar's LoRA adapter; None = the base model."
    )
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig(block_size=32)
    )
    mode: Literal["slots", "whole"] = Field(
        "slots",
        description="'slots': pick the tool, then predict every argument as its own "
        "short constrained generation, all batched (fast; the default). 'whole': one "
        "constrained generation of the whole invocation (pays off with a larger sidecar).",
    )
    prompt: Literal["signatures", "full"] = Field(
        "signatures",
        description="'slots' mode: the sidecar's prompt. 'signatures': one line per tool "
        "(name, typed arguments, description) - under a third of the tokens, and the sidecar's "
        "time is mostly its prompt's prefill; 'full': the main model's own prompt.",
    )
    choice_prompt: Literal["signatures", "names", "full"] = Field(
        "signatures",
        description="'slots' mode, several tools offered: the prompt the tool is chosen "
        "under. 'signatures': the slots' prompt. 'names': the main model's own prompt with "
        "each tool's name and description only (its listing's format, without the "
        "parameters: about 100 more tokens than the signatures on BFCL `multiple`). 'full': "
        "the main model's own prompt. With 'names' or 'full' the choice agrees with the main "
        "model's far more often (app/distill/README.md), for one more prefill beside the "
        "slots' prompt, on calls with a choice only.",
    )
    slot_tools: Literal["offered", "chosen"] = Field(
        "offered",
        description="'slots' mode, several tools offered: the tools the slots' prompt lists. "
        "'offered': every tool of the request, as the main model sees them. 'chosen': the "
        "chosen tool alone (its prompt then waits for the choice; fewer tokens, and no other "
        "tool's names and parameters to copy a value from).",
    )
    refill_repeats: bool = Field(
        True,
        description="'slots' mode: an argument whose value equals an earlier one's (most often "
        "copied from it: the second of two numbers) is filled again after the values before "
        "it; one more slot pass, on those calls only.",
    )
    waves: int = Field(
        1, ge=1, le=4,
        description="'slots' mode: wave n fills every argument after the first again, with "
        "the values wave n-1 found written before it (fixes values that depend on the ones "
        "before, e.g. the second of two numbers); each wave costs about one slot pass.",
    )
    predict_optional: bool = Field(
        True,
        description="'slots' mode: after the slots, one short step decides whether the call "
        "goes on after its required arguments (the model writes a tool's optional keys all or "
        "none, mostly), and the prediction leads with the call with every filled key or with "
        "the required keys alone accordingly (both are drafted either way).",
    )
    top_k: int = Field(1, ge=1, le=4, description="Alternatives in 'whole' mode.")
    max_tokens: int = Field(256, ge=16, description="Token budget of a 'whole' prediction.")
    slot_max_tokens: int = Field(48, ge=4, description="Token budget of one argument value.")
    verify: bool = Field(
        False,
        description="'slots' mode: one more pass over the whole call, drafted from the slots, "
        "before answering (agrees with the main model far more often, but with the same model "
        "on both sides it costs about what the main model's own drafted call costs; pays off "
        "with a sidecar on spare hardware). Per request: ooo_spec.diagnostics.verify_prediction.",
    )


class MainConfig(_Strict):
    engine: EngineConfig = Field(default_factory=EngineConfig)
    json_max_indent: int | None = Field(
        32, ge=0, le=256,
        description="Forced tool calls and `response_format`: between two JSON tokens the "
        "grammar allows nothing, one space, or one newline plus at most this many spaces/tabs "
        "(app/formats/json_grammar.py), so a weak model cannot loop on whitespace until "
        "max_tokens. None = vLLM's own grammar (any whitespace).",
    )


class RouterConfig(_Strict):
    max_body_bytes: int = Field(1_000_000, ge=1024)
    default_max_tokens: int | None = Field(
        None, ge=1,
        description="max_tokens of a request that gives none. None = as vLLM's OpenAI server: "
        "the rest of the context after the prompt, bounded by `limits.max_tokens`.",
    )
    request_timeout_s: float = Field(300, gt=0)
    body_timeout_s: float = Field(
        10.0, gt=0,
        description="Longest the router waits for a request's whole body once the request "
        "has arrived; past it a 408 `body_timeout` and the caller's concurrency slot is "
        "released (the slot is taken before the body is read, so a body sent slowly or not "
        "at all would hold it until the request deadline). 1 MB at 100 KB/s fits.",
    )


class LimitsConfig(_Strict):
    """What one request may ask for; the router checks it before any model work and answers
    a breach with a 400 that names the limit. The body size and the deadline are
    `router.max_body_bytes` (413) and `router.request_timeout_s` (503)."""

    max_json_depth: int = Field(
        64, ge=8, le=512,
        description="Nesting depth of the request body's JSON (deeper bodies would exhaust "
        "recursion in parsers and validators).",
    )
    max_messages: int = Field(512, ge=1)
    max_tools: int = Field(128, ge=1)
    max_schema_bytes: int = Field(
        65_536, ge=256, description="Size of one tool's `parameters` schema as compact JSON."
    )
    max_schema_depth: int = Field(
        24, ge=2, le=256, description="Nesting depth of one tool's `parameters` schema."
    )
    max_tokens: int = Field(
        4096, ge=1,
        description="Largest `max_tokens` / `max_completion_tokens` accepted; the main "
        "model's context (`main.engine.max_model_len`) bounds it as well.",
    )
    max_choices: int = Field(
        8, ge=1, le=128,
        description="Largest `n` (choices per chat completion); each choice is decoded as "
        "its own request, in parallel.",
    )
    max_request_tokens: int = Field(
        16_384, ge=1,
        description="Tokens one request may make the main model generate over all its choices "
        "(choices x `max_tokens`; a request without `max_tokens` counts the server's ceiling, "
        "`router.default_max_tokens` or `max_tokens` above): `n` multiplies decoding work.",
    )
    max_logprob_entries: int = Field(
        65_536, ge=1,
        description="Logprob entries one request may ask for (choices x `max_tokens` x "
        "`top_logprobs`, or `logprobs` on /v1/completions): each is a token the router "
        "decodes and sends; 2,048 tokens x 20 alternatives fit, 8 such choices do not.",
    )
    max_total_schema_bytes: int = Field(
        262_144, ge=256,
        description="All tool schemas of one request together, as compact JSON.",
    )
    max_schema_expansion: int = Field(
        10_000, ge=16,
        description="Subschemas one tool schema may expand to, following every `$ref` (a "
        "reference already being expanded, recursion, counts once) and every "
        "`allOf`/`anyOf`/`oneOf` branch: a small schema whose `allOf` lists the next `$ref` "
        "twice per level doubles the work per level.",
    )
    max_pattern_chars: int = Field(
        512, ge=8, description="Length of one `pattern` / `patternProperties` regex."
    )
    max_argument_chars: int = Field(
        32_768, ge=64,
        description="Length of one tool call's `arguments` string in the request's messages.",
    )
    max_stop_strings: int = Field(4, ge=0, description="Entries of `stop` (OpenAI's own cap).")
    max_stop_chars: int = Field(128, ge=1, description="Length of one `stop` string.")
    max_sidecar_slots: int = Field(
        32, ge=1,
        description="Argument slots the sidecar generates at once for one call (one engine "
        "request each); a tool with more properties gets no slot prediction.",
    )
    schema_check_timeout_s: float = Field(
        5.0, gt=0,
        description="CPU time for a request's schema work (metaschema checks, expansion count, "
        "pattern checks) in a worker thread, off the router's event loop; past it a 400 "
        "`request_too_complex`. CPU time, not wall time, so a busy machine does not refuse "
        "ordinary schemas (app/cpu_budget.py).",
    )
    grammar_compile_timeout_s: float = Field(
        5.0, gt=0,
        description="CPU time the main replica gives the grammar of a forced call to compile "
        "(xgrammar, in a worker thread) before the request goes to the engine; past it a "
        "400 `grammar_too_slow`, so no slow grammar waits in the engine's compile queue.",
    )
    check_max_wait_s: float = Field(
        60.0, gt=0,
        description="Longest a request waits on either check above, however little CPU time "
        "it has had (a machine so loaded the check hardly runs, or every check thread busy); "
        "past it the same 400.",
    )
    check_threads: int = Field(
        4, ge=1, le=64,
        description="Threads of a replica's check pool (app/check_pool.py), in which the "
        "grammar checks run: bounded, shared by identical requests, fair between tenants.",
    )
    check_threads_per_tenant: int = Field(
        1, ge=1,
        description="Most of the check pool's threads one tenant (API key; anonymous callers "
        "are one tenant) holds at once, a refused compile that still runs included: one "
        "tenant's slow schemas leave the other threads to the others.",
    )


class ApiKeyConfig(_Strict):
    key: SecretStr = Field(
        ..., min_length=8,
        description="The secret a client sends as a Bearer token. Shown as '**********' in "
        "dumps and logs; only the Router deployment receives the `auth` section.",
    )
    name: str | None = Field(
        None, description="Label in errors and metrics (the key itself is never shown)."
    )
    tenant: str | None = Field(
        None, min_length=1, max_length=64,
        description="Tenant the key belongs to: keys with the same tenant share its history, "
        "suffix index and prefix cache, and one share of every per-tenant bound (the check "
        "pools' threads, the caches' capacity), so a client with several keys holds no more "
        "than with one. None: the key is a tenant of its own.",
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="This key's own concurrency limit (default: the section's)."
    )


class AuthConfig(_Strict):
    """Optional API keys on the router. With no key configured (config or environment) the
    server is open, as the local default is; with any key, every `/v1` route needs one
    (`Authorization: Bearer <key>`, else 401) and each key has a concurrency limit (429 with
    `Retry-After` beyond it). `/healthz` stays open for probes."""

    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list,
        description="Keys in the config itself; a bare string is a key with no name. For local "
        "use: `args` are readable through Serve's config API (and in a RayService), so a "
        "cluster takes its keys from `api_keys_env`, set from a Secret.",
    )
    api_keys_env: str | None = Field(
        "OOO_SPEC_API_KEYS",
        description="Environment variable of the router with more keys, comma-separated "
        "(keeps secrets out of config files; e.g. from a Kubernetes Secret).",
    )
    max_concurrent_per_key: int = Field(
        64, ge=1,
        description="Engine requests one key may have in flight on one router replica: a "
        "request counts each choice's main-model request and the sidecar requests beside it "
        "(in slots mode one per argument slot; app/api/work.py). Beyond it a 429; a request "
        "that needs more than the whole limit runs only while the key has nothing else in "
        "flight.",
    )
    max_concurrent_anonymous: int | None = Field(
        None, ge=1,
        description="The same limit for callers without a key (a server with no keys "
        "configured): all anonymous requests on one router replica share it. Never more than "
        "the Router deployment's `max_ongoing_requests` (64 by default): beyond it Serve "
        "queues requests in front of the router, where no limit answers them, so a larger "
        "value is clamped to it at start (and `ooo-spec config check` reports it). None: "
        "that number.",
    )
    retry_after_s: int = Field(1, ge=1, description="`Retry-After` of a 429.")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _bare_keys(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"key": item} if isinstance(item, str) else item for item in value]
        return value


class FaultInjectionConfig(_Strict):
    """Test-only hooks (app/faults.py): a sidecar that hangs, fails or answers garbage, a tool
    worker that hangs or fails, armed through Ray handle methods, never over HTTP."""

    enabled: bool = Field(
        False, description="Allow arming faults. Off in every shipped config; tests turn it on."
    )


class ToolOverride(_Strict):
    """Operator's correction of one registered tool's flags; unset fields keep the tool's own."""

    idempotent: bool | None = Field(
        None,
        description="Running the tool twice with the same arguments is as safe as running it "
        "once. Changing it to false also turns `speculate` to 'never' unless that is set too.",
    )
    speculate: Literal["always", "never"] | None = Field(
        None,
        description="'always' lets a validated prediction start the tool before the main model "
        "commits; only allowed for idempotent tools.",
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit of one execution; past it the result is an error."
    )
    egress: bool | None = Field(
        None,
        description="The tool reaches services outside this deployment (privacy policy: such "
        "tools are not pre-executed unless `tool_worker.allow_egress`).",
    )


class McpServerConfig(_Strict):
    """An MCP server started as a subprocess and spoken to over stdio."""

    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Label in logs and errors."
    )
    command: list[str] = Field(
        ..., min_length=1, description="Program and arguments, e.g. ['python', '-m', 'my.server']."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for the server, on top of PATH, HOME and the like "
        "(the MCP SDK does not pass the whole environment on).",
    )
    timeout_s: float = Field(
        30, gt=0, description="Default per-call timeout of this server's tools (overridable)."
    )
    startup_timeout_s: float = Field(
        30, gt=0, description="Start, handshake and tool listing must finish within this."
    )


class ToolWorkerConfig(_Strict):
    """The tool worker pool: runs server-known tools, speculatively or after the commit."""

    threads: int = Field(
        16, ge=1,
        description="Python tools one replica runs at once (its thread pool); keep it at least "
        "the ToolWorker deployment's max_ongoing_requests.",
    )
    pre_execute: bool = Field(
        True,
        description="Global switch for speculative pre-execution of idempotent tools; false "
        "runs every tool only after the main model commits the call.",
    )
    allow_egress: bool = Field(
        False,
        description="Pre-execute tools marked `egress` too. Off by default: a speculative call "
        "to an outside service leaks the predicted intent even when the model never makes it.",
    )
    overrides: dict[str, ToolOverride] = Field(
        default_factory=dict,
        description="Per-tool flag corrections by tool name; a name no source registers is an "
        "error at startup.",
    )
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools join the Python ones."
    )

    @model_validator(mode="after")
    def _unique_servers(self) -> ToolWorkerConfig:
        names = [server.name for server in self.mcp_servers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tool_worker.mcp_servers: duplicate names {duplicates}")
        return self


class NgramBaselineConfig(_Strict):
    """vLLM's own prompt-lookup speculation on a second main engine: the peer every
    tool-calling speedup is compared against. Requests reach it with
    `ooo_spec: {"baseline": "ngram"}`; without it deployed they get a 400."""

    enabled: bool = Field(
        False,
        description="Deploy the engine. Off by default: it costs a second copy of the main "
        "model (memory, startup time) and only serves comparisons.",
    )
    engine: EngineConfig | None = Field(
        None, description="None: the same engine settings as `main.engine` (a fair peer)."
    )
    num_speculative_tokens: int = Field(16, ge=1, le=64)
    prompt_lookup_min: int = Field(2, ge=1)
    prompt_lookup_max: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _lookup_window(self) -> NgramBaselineConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("baselines.ngram.prompt_lookup_min must be <= prompt_lookup_max")
        return self

    def speculative_config(self) -> dict[str, Any]:
        """vLLM's `speculative_config` for this engine."""
        return {
            "method": "ngram",
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }


class SuffixBaselineConfig(_Strict):
    """vLLM's own suffix decoding (method `suffix`: arctic-inference's suffix trees over the
    prompt and over the engine's earlier outputs) on a further main engine, at vLLM's default
    settings: what a team serving an agent would run instead of ooo-spec. Requests reach it
    with `ooo_spec: {"baseline": "suffix"}`. Needs the `arctic-inference` package (built by
    scripts/setup.sh); `ooo-spec config check` says when it is missing."""

    enabled: bool = Field(
        False,
        description="Deploy the engine. Off by default: a further copy of the main model, for "
        "comparisons only.",
    )
    engine: EngineConfig | None = Field(
        None, description="None: the same engine settings as `main.engine` (a fair peer)."
    )

    def speculative_config(self) -> dict[str, Any]:
        """vLLM's `speculative_config` for this engine: the method alone, so every other
        setting (tree depth 24, spec factor, minimum probability, cached requests) is
        vLLM's default, as `vllm serve --speculative-config '{"method": "suffix"}'` runs."""
        return {"method": "suffix"}


class BaselinesConfig(_Strict):
    """Comparison engines beside the main model, selected per request by
    `ooo_spec.baseline`."""

    ngram: NgramBaselineConfig = Field(default_factory=NgramBaselineConfig)
    suffix: SuffixBaselineConfig = Field(default_factory=SuffixBaselineConfig)

    def deployed(self) -> list[str]:
        return [name for name, section in (("ngram", self.ngram), ("suffix", self.suffix))
                if section.enabled]


class TelemetryConfig(_Strict):
    """What traces may contain and how metrics aggregate. Whether and where traces go is the
    standard OTEL_* environment's business (see app/telemetry.py): off without an endpoint."""

    record_content: bool = Field(
        False,
        description="Put message text, predicted and committed tool arguments and tool results "
        "on spans. Off by default: they can be personal data.",
    )
    hit_rate_window: int = Field(
        100, ge=1,
        description="Scored requests the `ooo_spec_hit_rate` gauge averages over, per router "
        "replica.",
    )


class DiagnosticsConfig(_Strict):
    """Benchmark switches a request may set under `ooo_spec.diagnostics` that cost the server
    state, allowed only where the config says so."""

    suffix_scopes: bool = Field(
        False,
        description="Allow `ooo_spec.diagnostics.suffix_scope`: a separate suffix index per "
        "scope within the caller's tenant (a benchmark sends each mode as its own scope). "
        "Each scope is an index of up to `speculation.suffix.max_tokens_per_tenant` tokens, "
        "counted against the tenant's own (at most 8 scopes a tenant). Off by default: a "
        "request that sets it gets a 400 `diagnostics_disabled`. `ooo-spec bench --start` "
        "turns it on for the app it starts; configs/bench.yaml sets it.",
    )


class AppConfig(_Strict):
    main: MainConfig = Field(default_factory=MainConfig)
    sidecar: SidecarConfig = Field(default_factory=SidecarConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    tool_worker: ToolWorkerConfig = Field(default_factory=ToolWorkerConfig)
    baselines: BaselinesConfig = Field(default_factory=BaselinesConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    faults: FaultInjectionConfig = Field(default_factory=FaultInjectionConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    tools: list[str] = Field(
        default_factory=lambda: ["app.tools.builtin"],
        description="Python modules whose decorated functions become server-known tools.",
    )

    def deployment_names(self) -> list[str]:
        """The Serve deployments `build_app` makes from this config: the names a Serve config's
        `deployments:` entries may use."""
        names = [ROUTER, MAIN, TOOL_WORKER]
        if self.sidecar.enabled:
            names.append(SIDECAR)
        if self.baselines.ngram.enabled:
            names.append(MAIN_NGRAM)
        if self.baselines.suffix.enabled:
            names.append(MAIN_SUFFIX)
        return names


def load_config(args: dict[str, Any] | None) -> AppConfig:
    """Validate Serve `args` (or a YAML mapping) into an AppConfig; raises pydantic errors."""
    return AppConfig.model_validate(args or {})
