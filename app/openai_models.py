"""OpenAI Chat Completions wire models (requests) and the `ooo_spec` report (responses).

Requests are validated strictly: a field we do not implement, or a value we cannot honour,
is a 400 with a message, never silently ignored. Fields that change
nothing about the output (`user`, `metadata`, `store`) are accepted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.output_format import ResponseFormat
from app.speculation.draft_sources import SourceTallies
from app.speculation.reconcile import Outcome

SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Wire):
    name: str
    arguments: str


class ToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    # An earlier assistant turn's thinking, sent back by agents of interleaved-thinking models
    # (Kimi K2, GLM-4.7, MiniMax M2, DeepSeek): `reasoning` as vLLM 0.32 names it,
    # `reasoning_content` under its older name (read only when `reasoning` is absent, as vLLM
    # does). The chat template decides whether the model sees it (app/formats/chat_prompt.py).
    reasoning: str | None = None
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _content_parts(cls, content: Any) -> Any:
        """Every part names its `type`, and a text part carries its text as a string (the
        prompt joins the text parts: anything else would fail in the main replica)."""
        if not isinstance(content, list):
            return content
        for index, part in enumerate(content):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise ValueError(f"content part {index} needs a 'type' string")
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"content part {index} is a text part and needs 'text', a "
                                 "string")
        return content

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs 'tool_call_id'")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only 'assistant' messages may carry 'tool_calls'")
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"a '{self.role}' message needs 'content'")
        if self.role != "assistant" and (self.reasoning is not None
                                         or self.reasoning_content is not None):
            raise ValueError("only 'assistant' messages may carry 'reasoning' or "
                             "'reasoning_content'")
        if self.reasoning is None and self.reasoning_content is not None:
            self.reasoning = self.reasoning_content
        self.reasoning_content = None  # one name from here on: `reasoning`
        return self


class FunctionDef(_Wire):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    strict: bool | None = None


class ToolDef(_Wire):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Wire):
    include_usage: bool = False


class Diagnostics(_Wire):
    """Switches the benchmark (load_tests/bench/) uses to isolate one effect; they measure the
    server and change nothing a client needs (docs/wire-contract.md, "Diagnostics")."""

    # `false`: draft a candidate only while the output is a prefix of it (what re-alignment
    # after a divergence is worth).
    realign: bool = True
    # `false`: this request's drafts run to the budget instead of being sized by their worth
    # (`speculation.draft_worth`; benchmarks compare both on one server). No effect where the
    # server's sizing is off.
    draft_worth: bool = True
    # `false`: drafts from a tool's schema run on through the values the schema leaves open
    # (their placeholders) instead of stopping where each begins.
    value_stops: bool = True
    # Wait for the sidecar's prediction even when it came too late to draft from, and report it
    # as `ooo_spec.predictions` (its agreement with the committed call), at the cost of latency.
    await_prediction: bool = False
    # Overrides the server's `sidecar.verify` for this request (benchmarks compare both).
    verify_prediction: bool | None = None
    # `false`: the sidecar predicts with its base model, without its LoRA adapter
    # (`sidecar.lora`; benchmarks compare both on one server). No effect without an adapter.
    sidecar_adapter: bool = True
    # A separate suffix index within the caller's tenant (the `suffix` source): a benchmark
    # that sends every mode as one tenant gives each mode its own, so a mode learns from its
    # own earlier outputs (earlier turns of a conversation) and never from another mode's.
    suffix_scope: str | None = Field(None, min_length=1, max_length=64)


class OooSpecOptions(_Wire):
    enabled: bool = True
    # `false`: draft from the tool schemas and prompt lookup only, without asking the sidecar
    # (what the sidecar adds on a workload; where it does not pay, skip it). `sidecar.enabled`
    # in the config does the same for every request.
    sidecar: bool = True
    execute_tools: bool = False
    max_steps: int = Field(4, ge=1, le=16)
    # Can only turn pre-execution off for this request (benchmarks isolate its effect); the
    # server's `tool_worker.pre_execute` still decides whether it may happen at all.
    pre_execute: bool = True
    # Decode on a comparison engine (vLLM's own n-gram or suffix speculation) instead of the
    # main model; no sidecar runs. A 400 when that engine is not deployed.
    baseline: Literal["ngram", "suffix"] | None = None
    # Benchmark-only switches, apart from the options a client sets.
    diagnostics: Diagnostics = Field(default_factory=Diagnostics)
    # Past committed calls as candidates, and this request's call kept for later ones. Off for
    # benchmarks that send the same question in several modes (it would answer itself).
    history: bool = True
    # Draft from this tenant's earlier outputs and the request's own tokens (the `suffix`
    # source), and keep this output for later ones. Off like `history` where the same request
    # is sent in several modes by one tenant (it would answer itself).
    suffix: bool = True
    # Which offered tools are the server's own (entries copied from GET /v1/tools): only these
    # may be pre-executed or, with `execute_tools`, run by the server; `true` = every offered
    # tool the server registers. Default none: a client's own tool that happens to share a
    # server tool's name is never run by the server.
    server_tools: bool | list[str] = False

    @model_validator(mode="before")
    @classmethod
    def _flat_diagnostics(cls, data: Any) -> Any:
        """The diagnostics used to sit beside the client's options (`ooo_spec.realign`): still
        accepted there, and moved under `diagnostics` (which wins when both are given)."""
        if not isinstance(data, dict) or not any(k in data for k in Diagnostics.model_fields):
            return data
        data = dict(data)
        nested = data.get("diagnostics")
        merged = dict(nested) if isinstance(nested, dict) else {}
        for key in Diagnostics.model_fields:
            if key in data:
                merged.setdefault(key, data.pop(key))
        if isinstance(nested, Diagnostics):
            merged.update(nested.model_dump(exclude_unset=True))
        data["diagnostics"] = merged
        return data


# vLLM's bounds on a client's cache salt (vllm/entrypoints/openai/generate/base/protocol.py).
CACHE_SALT_MAX = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class SamplingFields(_Wire):
    """vLLM's sampling and routing extras, shared by chat completions, completions and (those
    it has) responses, with vLLM 0.32's names, types and bounds (its `SamplingParams._verify_args`
    and OpenAI protocol), so a bad value is a 400 here rather than in the engine step.

    With speculation on, vLLM's rejection sampler applies top_k, the three penalties, bad
    words and min_tokens to every drafted row (`vllm/v1/sample/rejection_sampler.py`), and
    stop_token_ids and ignore_eos are the scheduler's stop checks on each committed token: all
    keep drafts. vLLM refuses `min_p` and `logit_bias` on an engine with speculative decoding;
    a request with them decodes without drafts (`draft_free_reason`), where vLLM's plain
    sampler sets its token (docs/wire-contract.md, "Sampling fields")."""

    top_k: int | None = Field(None, ge=-1)  # 0 or -1: off, as vLLM
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    # Token id (a string, as OpenAI) -> bias; vLLM clamps each bias to [-100, 100].
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    bad_words: list[str] | None = None
    # Folded into the template's variables as vLLM does (`reasoning_effort`, and
    # `enable_thinking` unless the request sets it): the template's thinking switch.
    reasoning_effort: ReasoningEffort | None = None
    # Combined with the caller's tenant (never replacing it) into the prefix cache's salt.
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX)
    # The cache-affinity key within the tenant (deployments/prefix_router.py): requests with
    # the same one go to the replica that served it last.
    session_id: str | None = Field(None, min_length=1, max_length=256)
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=256)
    # vLLM's scheduler priority (lower first): only where the main engine runs the
    # `priority` policy (`main.engine.scheduling_policy`); otherwise a non-zero value is a 400.
    priority: int = Field(0, ge=SEED_MIN, le=SEED_MAX)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"logit_bias keys are token ids (non-negative integers as "
                                 f"strings), got {key[:20]!r}")
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError("logit_bias values must be finite numbers")
        return bias

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, ids: list[int] | None) -> list[int] | None:
        if any(i < 0 or i > 2**31 - 1 for i in ids or []):
            raise ValueError("stop_token_ids are token ids: non-negative integers")
        return ids

    @field_validator("bad_words")
    @classmethod
    def _bad_words(cls, words: list[str] | None) -> list[str] | None:
        if any(not w for w in words or []):
            raise ValueError("bad_words cannot contain an empty string")
        return words

    @field_validator("cache_salt")
    @classmethod
    def _salt_chars(cls, salt: str | None) -> str | None:
        if salt is not None and CACHE_SALT_FORBIDDEN & set(salt):
            raise ValueError("cache_salt must not contain '@', '/', '\\' or NUL")
        return salt

    def engine_sampling(self) -> dict[str, Any]:
        """The fields vLLM's `SamplingParams` takes, only those the request set."""
        out: dict[str, Any] = {}
        for name in ("top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "stop_token_ids", "bad_words"):
            value = getattr(self, name)
            if value is not None and value != []:
                out[name] = value
        if self.logit_bias:
            out["logit_bias"] = {int(k): max(-100.0, min(100.0, v))
                                 for k, v in self.logit_bias.items()}
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.min_tokens:
            out["min_tokens"] = self.min_tokens
        return out

    def draft_free_reason(self) -> str | None:
        """Why this request decodes without drafts, or None: vLLM 0.32 has no speculative
        path for these (`SamplingParams._validate_spec_decode`; its rejection sampler skips
        logits processors other than min_tokens on drafted rows)."""
        fields = [name for name, on in (("min_p", bool(self.min_p)),
                                        ("logit_bias", bool(self.logit_bias))) if on]
        if not fields:
            return None
        return (f"{' and '.join(fields)}: vLLM's speculative decoding does not apply "
                f"{'them' if len(fields) > 1 else 'it'} to drafted tokens, so this request "
                "decodes without drafts")

    def sampling_field_values(self) -> dict[str, Any]:
        """The fields set on this request, to carry them onto another request model."""
        return {name: getattr(self, name) for name in SamplingFields.model_fields
                if name in self.model_fields_set}

    def affinity_key(self) -> str | None:
        """The cache-affinity key the client chose (`prompt_cache_key`, else `session_id`)."""
        return self.prompt_cache_key or self.session_id


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Extra variables for the model's chat template (e.g. `enable_thinking`), as in vLLM;
    # only variables the template uses reach it (app/formats/chat_prompt.py).
    chat_template_kwargs: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # vLLM seeds a torch.Generator per request inside the engine step; torch accepts
    # [-2**63, 2**64 - 1] and vLLM's own OpenAI server int64: outside it, a 400 here rather
    # than an exception in the step loop that fails every request in flight.
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    ooo_spec: OooSpecOptions = Field(default_factory=OooSpecOptions)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _fold_reasoning_effort(self) -> ChatCompletionRequest:
        """As vLLM: `reasoning_effort` reaches the template as a variable, and switches its
        thinking on (off for `none`) unless `chat_template_kwargs` sets `enable_thinking`."""
        if self.reasoning_effort is None:
            return self
        kwargs = dict(self.chat_template_kwargs or {})
        kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        self.chat_template_kwargs = kwargs
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using 'top_logprobs', 'logprobs' must be set to true")
        return self

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self) -> ChatCompletionRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        choice = self.tool_choice
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs at least one tool in 'tools'")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(
                f"tool_choice names function '{choice.function.name}', which is not in 'tools'"
            )
        declared = self.ooo_spec.server_tools
        if isinstance(declared, list):
            missing = sorted(set(declared) - set(names))
            if missing:
                raise ValueError(f"ooo_spec.server_tools names {missing}, not in 'tools'")
        return self

    @model_validator(mode="after")
    def _one_output_constraint(self) -> ChatCompletionRequest:
        if self.response_format is None:
            return self
        schema = self.response_format.output_schema()  # ValueError: json_schema missing
        if schema is not None and self.effective_tool_choice in ("required", "named"):
            raise ValueError("a forced tool call (tool_choice 'required' or a named tool) "
                             "cannot be combined with a JSON response_format")
        return self

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema `response_format` constrains the output to, if any."""
        return self.response_format.output_schema() if self.response_format else None

    @property
    def server_tool_names(self) -> frozenset[str]:
        """Offered tools the request lets the server run (`ooo_spec.server_tools`)."""
        declared = self.ooo_spec.server_tools
        if declared is True:
            return frozenset(t.function.name for t in self.tools or [])
        return frozenset(declared or [])

    @property
    def effective_tool_choice(self) -> str:
        """'none' | 'auto' | 'required' | 'named' (OpenAI's default: auto when tools exist)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    @property
    def named_tool(self) -> str | None:
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return None

    def tool_schemas(self, names: frozenset[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each offered tool's `parameters` schema by name (only `names`, when given)."""
        return {t.function.name: t.function.parameters for t in self.tools or []
                if names is None or t.function.name in names}

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


# ----- the ooo_spec report ------------------------------------------------------------------
# `Outcome` (hit, partial, miss, ...): app/speculation/reconcile.py, which decides it.


class CandidateReport(BaseModel):
    source: Literal["sidecar", "history"]
    name: str
    arguments: dict[str, Any]
    valid: bool
    ready_ms: float


class MainReport(BaseModel):
    steps: int = 0
    completion_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    # Drafted, accepted and gained tokens per draft source (app/speculation/draft_sources.py).
    sources: SourceTallies = Field(default_factory=SourceTallies)
    # Prompt tokens the engine's prefix cache served instead of prefilling them.
    cached_tokens: int = 0


# Why a replica was chosen under cache-affinity routing (app/api/prefix_index.py).
RoutingReason = Literal["affinity", "no_match", "short_match", "imbalanced"]


class RouteReport(BaseModel):
    """Where one main call ran and what the prefix cache gave it (issue 31,
    docs/operations.md "Cache affinity across replicas")."""

    replica: str | None = None  # the MainModel replica's id
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of them, served by the replica's prefix cache (this tenant's)
    # How cache-affinity routing chose the replica: `affinity` (it held the longest prefix of
    # this tenant's prompt) or why power of two choices did; None: Serve's own router chose.
    decision: RoutingReason | None = None
    matched_chars: int = 0  # the longest prefix a live replica held, in rendered characters


class ToolResultReport(BaseModel):
    tool_call_id: str
    name: str
    content: str
    speculative: bool
    latency_ms: float
    saved_ms: float


class TimingsReport(BaseModel):
    total: float = 0.0
    sidecar: float = 0.0
    main: float = 0.0
    tools: float = 0.0
    # From the request's arrival to the first turn's commit (its calls parsed), router clock.
    first_commit: float = 0.0


class PredictionReport(BaseModel):
    """The sidecar's first candidate as it arrived (only with
    `diagnostics.await_prediction: true`)."""

    ready_ms: float  # from the fan-out to its arrival at the router
    elapsed_ms: float = 0.0  # inside the sidecar
    passes: int = 0  # the passes this prediction's own requests were in (`Prediction.passes`)
    calls: list[dict[str, Any]] = Field(default_factory=list)
    no_call: bool = False
    # Generic (app/api/chat_service.py: PREDICTION_FAILED); the detail is logged server-side.
    error: str | None = None


SidecarReason = Literal[
    "always", "measuring", "pays", "does_not_pay", "probe", "pre_execution", "diagnostics",
    # Wanted, but the router's gate found too many sidecar calls pending (app/api/sidecar_gate.py).
    "busy",
]


class SidecarDecision(BaseModel):
    """Whether a turn called the sidecar and why (app/api/sidecar_value.py)."""

    call: bool
    reason: SidecarReason
    # The sidecar's mean net gain (accepted tokens beyond the other sources', less what it
    # slowed the main passes) over its recent calls for this tenant and tool set (or the
    # tenant, where the tool set is not yet measured), and how many calls; None: none measured.
    gain_tokens: float | None = None
    samples: int = 0


class OooSpecReport(BaseModel):
    enabled: bool
    outcome: Outcome
    baseline: str | None = None  # the comparison engine that decoded, when one did
    candidates: list[CandidateReport] = Field(default_factory=list)
    main: MainReport = Field(default_factory=MainReport)
    tool_results: list[ToolResultReport] = Field(default_factory=list)
    predictions: list[PredictionReport] = Field(default_factory=list)
    timings_ms: TimingsReport = Field(default_factory=TimingsReport)
    # One per turn that could have called the sidecar (none when the request did not want it).
    sidecar_decisions: list[SidecarDecision] = Field(default_factory=list)
    # One per main call, in turn order.
    routing: list[RouteReport] = Field(default_factory=list)
    # Why the request decoded without drafts although speculation was on (a sampling field
    # vLLM's speculative decoding does not apply: `SamplingFields.draft_free_reason`).
    no_drafts_reason: str | None = None
