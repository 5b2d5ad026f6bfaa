"""The main model: prompt rendering, forced tool calls, candidates into the proposer's store.

Library side of the `MainModel` deployment (which only adds Ray plumbing). One request:
`prepare` (validate against the context, build the prompt and sampling), then `run`, which
streams events while candidates may arrive at any time through `candidates` (an awaitable).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from opentelemetry.context import Context

from app import telemetry
from app.check_pool import CheckPool
from app.config import AppConfig
from app.drafting.auto_drafts import AutoDrafts
from app.drafting.history import InvocationHistory, request_text
from app.drafting.suffix_index import SuffixIndex, TenantSuffixes
from app.engine.protocol import DraftStore, Engine
from app.engine.vllm_engine import GenerationTally, VllmEngine
from app.formats import chat_prompt
from app.formats.grammar_check import GrammarCheck, GrammarTooSlow, engine_grammar_check
from app.formats.json_grammar import GrammarError, bounded_whitespace_grammar
from app.formats.logprobs import TokenLogprobs, chat_logprobs, completion_logprobs
from app.formats.reasoning import Reasoning
from app.formats.structural_tag import (
    ONE_LINE_ARGUMENTS,
    call_tag,
    engine_tag_model,
    tag_grammar,
    wants_tag,
)
from app.formats.tool_format import (
    ParsedCall,
    ParsedOutput,
    SchemaDraft,
    forced_output_schema,
    parse_forced,
    placeholder_call,
    placeholder_object,
    render_forced_variants,
    render_json_variants,
    render_tagged_variants,
    schema_drafts,
)
from app.formats.tool_formats import get_format
from app.formats.tool_formats.families import load_chat_template
from app.formats.tool_formats.vllm_parsing import VllmParsing, keeps_special_tokens
from app.openai_models import CandidateReport, ChatCompletionRequest, MainReport
from app.speculation.canonical import Invocation
from app.speculation.draft_sources import DraftSource, SourceTallies
from app.speculation.prediction import Prediction
from app.speculation.turn import (
    SidecarDelivery,
    SidecarStatus,
    TurnDelta,
    TurnError,
    TurnEvent,
    TurnResult,
)
from app.speculation.validation import validate_arguments
from app.tenancy import ANONYMOUS_TENANT

logger = logging.getLogger(__name__)


def completion_budget(
    context: int, prompt_tokens: int, wanted: int | None, default: int | None, ceiling: int
) -> int:
    """max_tokens for the engine, as vLLM's OpenAI server computes it (`get_max_tokens`):
    the smallest of the rest of the context, the request's own value (or the configured
    default when it gives none) and the server's ceiling (`limits.max_tokens`).

    >>> completion_budget(2048, 100, None, None, 4096)  # no max_tokens: the rest of the context
    1948
    >>> completion_budget(2048, 100, None, None, 512), completion_budget(2048, 100, 64, None, 512)
    (512, 64)
    """
    fallback = wanted if wanted is not None else default
    return min(v for v in (context - prompt_tokens, fallback, ceiling) if v is not None)


def prefix_cache_salt(tenant: str, client_salt: str | None) -> str:
    """The prefix cache's salt: the tenant's, with the client's own `cache_salt` after it, so
    a client can split its tenant's cache further but never reach another tenant's ('@' is
    in no tenant name and no client salt, app/openai_models.py).

    >>> prefix_cache_salt("tenant-1", None), prefix_cache_salt("tenant-1", "s")
    ('tenant-1', 'tenant-1@s')
    """
    return tenant if client_salt is None else f"{tenant}@{client_salt}"


@dataclass
class PreparedRequest:
    request: ChatCompletionRequest
    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    mode: str  # 'none' | 'auto' | 'required' | 'named'
    tools: list[dict[str, Any]]
    speculate: bool
    # /v1/completions: the prompt is raw text (no chat template), logprobs in its shape.
    raw_prompt: bool = False
    # Thinking models (`main.engine.reasoning_parser`); None: the output has no reasoning.
    reasoning: Reasoning | None = None
    # Whose request (the router's authenticated key): history and the prefix cache are its own.
    tenant: str = ANONYMOUS_TENANT
    # A structural tag constrains the calls (app/formats/structural_tag.py): a forced call is
    # written in the model's own format, not as the JSON fallback.
    calls_in_format: bool = False


def with_choice(shared: PreparedRequest, request: ChatCompletionRequest) -> PreparedRequest:
    """One choice's request prepared from the rendering it shares with the other choices
    (`MainModelService.prepare_shared`): its own request, seed and copy of the prompt."""
    sampling = {k: v for k, v in shared.sampling.items() if k != "seed"}
    if request.seed is not None:
        sampling["seed"] = request.seed
    return replace(shared, request=request, sampling=sampling,
                   prompt_token_ids=list(shared.prompt_token_ids))


@dataclass
class CandidateIntake:
    """What happened to the sidecar's answer inside the main replica."""

    reports: list[CandidateReport] = field(default_factory=list)
    status: SidecarStatus = "pending"
    error: str | None = None
    sidecar_ms: float = 0.0
    no_call: bool = False


def suffix_key(prepared: PreparedRequest) -> tuple[str, str | None]:
    """Whose suffix index a request uses, as (tenant, scope): its tenant's own (scope None),
    or a scope within it (`ooo_spec.diagnostics.suffix_scope`, counted against the tenant's
    own budget); never another tenant's."""
    return prepared.tenant, prepared.request.ooo_spec.diagnostics.suffix_scope


class SourcedText(NamedTuple):
    """A candidate text and the source it came from (drafts are counted per source)."""

    text: str
    source: DraftSource
    # Where a draft from the text stops: a schema draft's values (app/formats/tool_format.py).
    stops: tuple[int, ...] = ()


class CandidateFeed:
    """One turn's drafts on their way into the proposer's store: those known at the start
    (past calls, the schemas' keys), then the sidecar's when they arrive, ahead of the others
    (they win ties). They wait for the engine's id of the request (`on_start`) and, for a
    thinking model, for the end of its reasoning: then they are offered behind the text
    written so far (`prefix`). In `tool_choice: auto` the request's `AutoDrafts` gate takes
    them instead and picks, step by step, which apply to the output so far (thinking included)."""

    def __init__(self, store: DraftStore, thinking: bool, status: SidecarStatus,
                 auto: AutoDrafts | None = None, suffix: SuffixIndex | None = None) -> None:
        self.store = store
        self.intake = CandidateIntake(status=status)
        self.pending: list[SourcedText] = []
        self.request_id: str | None = None
        self.auto = auto
        # The tenant's earlier outputs (the `suffix` source), handed to the store at the start.
        self.suffix = suffix
        self.prefix: str | None = None if thinking and auto is None else ""

    def on_start(self, request_id: str) -> None:
        self.request_id = request_id
        if self.auto is not None:
            self.store.set_gate(request_id, self.auto)
        if self.suffix is not None:
            self.store.set_suffix(request_id, self.suffix)
        self.offer(self.pending)

    def add(self, texts: list[str], source: DraftSource) -> None:
        """Candidates known before the start (past calls, schemas), behind earlier ones."""
        self.pending.extend(SourcedText(t, source) for t in texts)

    def add_schema(self, drafts: list[SchemaDraft]) -> None:
        """The schema drafts, behind earlier candidates."""
        self.pending.extend(SourcedText(d.text, "schema", d.stops) for d in drafts)

    def add_prediction(self, rendered: list[str]) -> None:
        items = [SourcedText(t, "sidecar") for t in rendered]
        self.pending[:0] = items
        self.offer(items)

    def reasoning_ended(self, prefix: str) -> None:
        self.prefix = prefix
        self.offer(self.pending)

    def offer(self, items: list[SourcedText]) -> None:
        if self.request_id is None or self.prefix is None or not items:
            return
        # The store puts each batch in front of what it holds: the last run goes in first.
        for source, run in reversed(_runs(items)):
            if self.auto is not None:
                if source != "schema":  # the gate holds the schemas itself
                    self.auto.predicted([item.text for item in run], source)
                continue
            # The model may or may not leave a blank line after its thoughts.
            heads = [self.prefix + sep for sep in ("", "\n\n")] if self.prefix else [""]
            drafts = [SchemaDraft(item.text, item.stops).behind(head)
                      for item in run for head in heads]
            self.store.add_candidates(self.request_id, [d.text for d in drafts], source,
                                      {d.text: d.stops for d in drafts if d.stops})


def _runs(items: list[SourcedText]) -> list[tuple[DraftSource, list[SourcedText]]]:
    """Consecutive texts of one source, in order.

    >>> [(source, [i.text for i in run]) for source, run in _runs([
    ...     SourcedText("a", "history"), SourcedText("b", "history"),
    ...     SourcedText("c", "schema")])]
    [('history', ['a', 'b']), ('schema', ['c'])]
    """
    runs: list[tuple[DraftSource, list[SourcedText]]] = []
    for item in items:
        if runs and runs[-1][0] == item.source:
            runs[-1][1].append(item)
        else:
            runs.append((item.source, [item]))
    return runs


class MainModelService:
    def __init__(self, config: AppConfig, engine: Engine | None = None) -> None:
        """`engine`: another engine than the main one with the candidate proposer (the
        n-gram baseline, see app/main_model/baselines.py)."""
        self.config = config
        self.engine: Engine = engine or VllmEngine(config.main.engine, config.speculation)
        history = config.speculation.history
        self.grammar_check: GrammarCheck | None = None  # built by start()
        self.prepare_pool: CheckPool | None = None  # built by start()
        self.history: InvocationHistory | None = (
            InvocationHistory(history.max_entries, history.min_similarity, history.private_tools,
                              history.max_entries_per_tenant)
            if history.enabled else None
        )
        suffix = config.speculation.suffix
        self.suffixes: TenantSuffixes | None = (
            TenantSuffixes(suffix.max_depth, suffix.max_tokens_per_tenant, suffix.max_tenants,
                           suffix.min_match, min_token_prob=suffix.min_token_prob)
            if suffix.enabled else None
        )
        self._suffix_writer = ThreadPoolExecutor(1, thread_name_prefix="suffix-writer")
        # The latest output's write (tests and shutdown wait for it); None before any.
        self.suffix_writes: Future[None] | None = None
        self.format = get_format(config.main.engine.tool_format)
        self.tag_model = engine_tag_model(config.main.engine)
        # Known once the engine (and its tokenizer) has started: see `template`.
        self._template: tuple[bool, frozenset[str]] | None = None

    def start(self) -> None:
        self.engine.start()
        limits = self.config.limits
        self.grammar_check = engine_grammar_check(self.engine, limits, "main")
        if self.format.vllm_backed:  # read by vLLM's parser, written through the template
            template = self.config.main.engine.chat_template
            self.format = get_format(self.format.name, self.engine.tokenizer,
                                     load_chat_template(template) if template else None)
        mismatch = chat_prompt.format_mismatch(self.engine.tokenizer, self.format)
        if mismatch:
            logger.warning("tool format: %s", mismatch)
        # Rendering and tokenising prompts (and a forced call's grammar text): bounded work,
        # shared by a request's choices; 2 threads per tenant leave 2 to the others.
        self.prepare_pool = CheckPool(4, 2, "prepare")

    async def prepare_shared(
        self,
        request: ChatCompletionRequest,
        raw_prompt: str | list[int] | None = None,
        tenant: str = ANONYMOUS_TENANT,
    ) -> PreparedRequest:
        """`prepare` off the replica's event loop (a long conversation's template and
        tokeniser take CPU time every other request's stream would wait for), and once for
        the `n` choices of one request: they arrive as requests that differ in their `seed`
        alone (app.api), and share one rendering in the prepare pool."""
        if self.prepare_pool is None:  # not started (offline use)
            return self.prepare(request, raw_prompt, tenant)
        key = ("prepare", request.model_dump_json(exclude={"seed"}), json.dumps(raw_prompt))
        shared = await self.prepare_pool.run(
            tenant, key, lambda: self.prepare(request, raw_prompt, tenant), math.inf, math.inf)
        return with_choice(shared, request)

    async def count_prompt_tokens(self, request: ChatCompletionRequest,
                                  tenant: str = ANONYMOUS_TENANT) -> int:
        """The prompt's tokens as `prepare` renders them (the template, the tools unless
        `tool_choice` is none), in the prepare pool like a prompt to decode; no context check:
        a count is what tells a client its conversation no longer fits."""
        def count() -> int:
            tools = request.tool_dicts() if request.effective_tool_choice != "none" else []
            return len(self.prompt_ids(request, tools))

        if self.prepare_pool is None:  # not started (offline use)
            return count()
        key = ("count", request.model_dump_json())
        result: int = await self.prepare_pool.run(tenant, key, count, math.inf, math.inf)
        return result

    def tokenize(self, request: ChatCompletionRequest, prompt: str | None,
                 special_tokens: bool, strs: bool) -> dict[str, Any]:
        """`POST /tokenize` in vLLM's shape: `prompt` as is, else the request's messages and
        tools as `prepare` renders them."""
        tokenizer = self.engine.tokenizer
        if prompt is not None:
            ids = list(tokenizer.encode(prompt, add_special_tokens=special_tokens))
        else:
            mode = request.effective_tool_choice
            ids = self.prompt_ids(request, request.tool_dicts() if mode != "none" else [])
        return {"count": len(ids), "max_model_len": self.config.main.engine.max_model_len,
                "tokens": ids,
                "token_strs": list(tokenizer.convert_ids_to_tokens(ids)) if strs else None}

    def detokenize(self, tokens: list[int]) -> dict[str, Any]:
        """`POST /detokenize` in vLLM's shape; an id outside the vocabulary is a 400."""
        vocab = len(self.engine.tokenizer)
        wrong = [t for t in tokens if not 0 <= t < vocab][:5]
        if wrong:
            raise TurnError(f"token id(s) {wrong} are outside the vocabulary of {vocab}",
                            param="tokens")
        return {"prompt": self.engine.tokenizer.decode(tokens)}

    async def check_grammar(self, prepared: PreparedRequest) -> None:
        """A forced call's grammar must compile within `limits.grammar_compile_timeout_s` of CPU
        time (app/formats/grammar_check.py): a 400 `grammar_too_slow` otherwise."""
        if self.grammar_check is None:
            return
        try:
            await self.grammar_check.check_sampling(prepared.sampling, prepared.tenant)
        except GrammarTooSlow:
            raise TurnError(
                f"the tool schemas' grammar did not compile within "
                f"{self.grammar_check.timeout_s:g} s of CPU time; simplify the schemas (fewer "
                "or shorter bounded repeats, lengths, enums)",
                param="tools",
                code="grammar_too_slow",
            ) from None

    @property
    def model_name(self) -> str:
        return self.config.main.engine.served_model_name

    # ----- request preparation ----------------------------------------------------------
    def prepare(
        self,
        request: ChatCompletionRequest,
        raw_prompt: str | list[int] | None = None,
        tenant: str = ANONYMOUS_TENANT,
    ) -> PreparedRequest:
        """`raw_prompt` (/v1/completions, whose request comes as a chat request without
        tools): the text or token ids the model continues, instead of the chat template."""
        mode = request.effective_tool_choice
        tools = request.tool_dicts() if mode != "none" else []
        if raw_prompt is None:
            prompt = self.prompt_ids(request, tools)
        elif isinstance(raw_prompt, str):
            prompt = list(self.engine.tokenizer.encode(raw_prompt))
        else:
            prompt = list(raw_prompt)
        limit = self.config.main.engine.max_model_len
        if len(prompt) >= limit:
            raise TurnError(
                f"the {'prompt' if raw_prompt is not None else 'messages'} take {len(prompt)} "
                f"tokens, more than the model's context of {limit} tokens; shorten the "
                f"{'prompt' if raw_prompt is not None else 'conversation or the tool list'}",
                param="prompt" if raw_prompt is not None else "messages",
                code="context_length_exceeded",
            )
        max_tokens = completion_budget(
            limit, len(prompt), request.max_completion_tokens or request.max_tokens,
            self.config.router.default_max_tokens, self.config.limits.max_tokens,
        )
        sampling: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
        }
        if request.seed is not None:
            sampling["seed"] = request.seed
        if request.logprobs:
            # As vLLM: the sampled token's logprob plus `top_logprobs` alternatives.
            sampling["logprobs"] = request.top_logprobs or 0
        if request.stop:
            sampling["stop"] = [request.stop] if isinstance(request.stop, str) else request.stop
        sampling.update(request.engine_sampling())
        if raw_prompt is None and self.keeps_special_tokens(request, mode, bool(tools)):
            sampling["skip_special_tokens"] = False
        if request.priority:
            if self.config.main.engine.scheduling_policy != "priority":
                raise TurnError("'priority' needs the main engine's priority scheduling "
                                "(main.engine.scheduling_policy: priority); this server runs "
                                "first come, first served", param="priority")
            sampling["priority"] = request.priority
        # Forced outputs (calls, response_format) leave no room to think, nor does
        # /v1/completions (no chat turn).
        reasoning = Reasoning.for_request(
            self.config.main.engine.reasoning_parser, request.chat_template_kwargs,
            self.engine.tokenizer,
        ) if mode in ("auto", "none") and raw_prompt is None and request.output_schema is None \
            else None
        in_format = (self.tag_model is not None and reasoning is None
                     and request.output_schema is None and wants_tag(
                         mode, tools, request.parallel_tool_calls,
                         self.config.main.engine.tool_strict_level))
        if in_format:
            sampling.update(self.tag_constraint(tools, mode, request))
        elif mode in ("required", "named"):
            sampling.update(self.json_constraint(forced_output_schema(
                tools, request.named_tool, parallel=request.parallel_tool_calls is True
            )))
        elif request.output_schema is not None:
            sampling.update(self.json_constraint(request.output_schema))
        return PreparedRequest(
            request=request,
            prompt_token_ids=prompt,
            sampling=sampling,
            mode=mode,
            tools=tools,
            # Without the candidate proposer nothing would read the drafts.
            speculate=request.ooo_spec.enabled
            and (bool(tools) or request.output_schema is not None or raw_prompt is not None)
            and self.engine.speculation is not None
            and request.draft_free_reason() is None,
            reasoning=reasoning,
            raw_prompt=raw_prompt is not None,
            tenant=tenant,
            calls_in_format=in_format,
        )

    @property
    def template(self) -> tuple[bool, frozenset[str]]:
        """(whether the chat template renders tools, the variables it reads)."""
        if self._template is None:
            tokenizer = self.engine.tokenizer
            self._template = (chat_prompt.template_renders_tools(tokenizer),
                              chat_prompt.template_variables(tokenizer))
        return self._template

    def prompt_ids(self, request: ChatCompletionRequest, tools: list[dict[str, Any]]) -> list[int]:
        """The model's own template with `tools=` when it renders tools (as vLLM does), else
        the format's fallback tool prompt; `chat_template_kwargs` reach the template either way."""
        native, variables = self.template
        try:
            kwargs = chat_prompt.template_kwargs(request.chat_template_kwargs, variables)
        except ValueError as exc:
            raise TurnError(str(exc), param="chat_template_kwargs") from None
        tokenizer = self.engine.tokenizer
        if native:
            template_tools = None if request.tools is None else [
                chat_prompt.TemplateTool(
                    t.function.name, t.function.description,
                    t.function.parameters if "parameters" in t.function.model_fields_set
                    else None,
                    t.function.strict,
                ) for t in request.tools
            ]
            text = chat_prompt.render_native(
                tokenizer, request.message_dicts(), template_tools, kwargs
            )
        elif not kwargs:
            return self.engine.chat_prompt_ids(
                self.format.prepare_messages(request.message_dicts(), tools or None)
            )
        else:
            text = chat_prompt.render_fallback(
                tokenizer, self.format, request.message_dicts(), tools or None, kwargs
            )
        return list(tokenizer.encode(text, add_special_tokens=False))

    def json_constraint(self, schema: dict[str, Any]) -> dict[str, Any]:
        """Sampling options that constrain the output to JSON matching `schema`: the
        bounded-whitespace grammar (app/formats/json_grammar.py), or vLLM's own JSON grammar
        when `main.json_max_indent` is None."""
        max_indent = self.config.main.json_max_indent
        if max_indent is None:
            return {"structured_json": schema}
        try:
            return {"structured_grammar": bounded_whitespace_grammar(schema, max_indent)}
        except GrammarError as exc:
            raise TurnError(f"the engine rejected the request: {exc}",
                            code="rejected_by_engine") from None

    def tag_constraint(
        self, tools: list[dict[str, Any]], mode: str, request: ChatCompletionRequest
    ) -> dict[str, Any]:
        """Sampling options that constrain the calls with the format's structural tag: its
        grammar with bounded whitespace, or the tag itself when `main.json_max_indent` is
        None."""
        try:
            tag = call_tag(self.tag_model or "", tools, mode, request.named_tool,
                           request.parallel_tool_calls,
                           self.config.main.engine.tool_strict_level)
            max_indent = self.config.main.json_max_indent
            one_line = self.tag_model in ONE_LINE_ARGUMENTS
            if max_indent is None and not one_line:
                return {"structured_tag": tag}
            return {"structured_grammar": tag_grammar(tag, max_indent or 0, one_line)}
        except GrammarError as exc:
            raise TurnError(f"the engine rejected the request: {exc}",
                            code="rejected_by_engine") from None

    # ----- candidates -------------------------------------------------------------------
    def render_candidate(self, prepared: PreparedRequest, calls: list[ParsedCall]) -> list[str]:
        """Texts of the whole output the main model may write for `calls`: one per whitespace
        style; the proposer follows the one the model's output agrees with."""
        if prepared.mode in ("required", "named") and prepared.calls_in_format:
            return render_tagged_variants(self.format, calls, prepared.tools)
        if prepared.mode in ("required", "named"):
            return render_forced_variants(calls, prepared.tools, prepared.request.named_tool)
        return self.format.render_variants(calls)

    def schema_candidates(self, prepared: PreparedRequest) -> list[SchemaDraft]:
        """Keys and punctuation of every callable tool (or of the `response_format`
        schema), known before any prediction, each with where its values begin (a draft
        stops there; `ooo_spec.diagnostics.value_stops: false` drafts through them). In auto
        mode they are written in the format's call syntax and apply once the output opens a
        call (app/drafting/auto_drafts.py)."""
        stopped = prepared.request.ooo_spec.diagnostics.value_stops

        def drafts(render: Callable[[bool], list[str]]) -> list[SchemaDraft]:
            """`render(alternate)`'s texts, with their stops unless switched off."""
            texts = render(False)
            return schema_drafts(texts, render(True)) if stopped else [
                SchemaDraft(t) for t in texts]

        schema = prepared.request.output_schema
        if schema is not None and prepared.mode not in ("required", "named"):
            return drafts(lambda alternate: render_json_variants(
                placeholder_object(schema, alternate), schema))
        if prepared.mode not in ("required", "named", "auto"):
            return []
        tools = [
            t for t in prepared.tools
            if prepared.mode != "named" or t["function"]["name"] == prepared.request.named_tool
        ]

        def calls(tool: dict[str, Any], alternate: bool) -> list[str]:
            return self.render_candidate(prepared, [placeholder_call(tool, alternate)])

        return [d for tool in tools for d in drafts(functools.partial(calls, tool))]

    def auto_drafts(self, prepared: PreparedRequest) -> AutoDrafts | None:
        """The drafting state of a speculative `tool_choice: auto` chat request."""
        # A `response_format` constrains the output to its JSON: no call can open.
        if (prepared.mode != "auto" or not prepared.speculate or prepared.raw_prompt
                or prepared.request.output_schema is not None):
            return None
        return AutoDrafts(self.format, prepared.reasoning, [])

    def intake(
        self,
        prepared: PreparedRequest,
        prediction: Prediction,
        started: float,
    ) -> tuple[CandidateIntake, list[str]]:
        """Validate a prediction's candidates and render the valid ones to token ids."""
        intake = CandidateIntake(status="received", sidecar_ms=prediction.elapsed_ms)
        ready_ms = (time.perf_counter() - started) * 1000
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {}
                   for t in prepared.tools}
        rendered: list[str] = []
        if prediction.error:
            intake.status = "error"
            intake.error = prediction.error
            return intake, rendered
        intake.no_call = prediction.no_call
        for group in prediction.candidates:
            calls = [ParsedCall(c.name, dict(c.arguments)) for c in group]
            all_valid = True
            for call in calls:
                schema = schemas.get(call.name)
                valid = schema is not None and not validate_arguments(call.arguments, schema)
                all_valid &= valid
                intake.reports.append(
                    CandidateReport(
                        source=prediction.source,
                        name=call.name,
                        arguments=call.arguments,
                        valid=valid,
                        ready_ms=ready_ms,
                    )
                )
            if calls and all_valid:
                if prepared.mode == "named" and calls[0].name != prepared.request.named_tool:
                    continue
                rendered.extend(self.render_candidate(prepared, calls))
        return intake, rendered

    def uses_history(self, prepared: PreparedRequest) -> bool:
        return (self.history is not None and prepared.request.ooo_spec.history
                and self.engine.speculation is not None)

    def uses_suffix(self, prepared: PreparedRequest) -> bool:
        """Whether the request drafts from (when it speculates) and adds to its tenant's
        earlier outputs."""
        options = prepared.request.ooo_spec
        return (self.suffixes is not None and options.enabled and options.suffix
                and self.engine.speculation is not None)

    def history_candidates(
        self, prepared: PreparedRequest, started: float
    ) -> tuple[list[CandidateReport], list[str]]:
        """Past calls for a similar request, validated against today's schemas and rendered."""
        assert self.history is not None
        names = {t["function"]["name"] for t in prepared.tools}
        found = self.history.candidates(request_text(prepared.request.message_dicts()), names,
                                        tenant=prepared.tenant)
        if not found:
            return [], []
        intake, rendered = self.intake(
            prepared, Prediction(source="history", candidates=found), started
        )
        # A past call that today's schema refuses drafts nothing: it is not reported either.
        return [r for r in intake.reports if r.valid], rendered

    # ----- generation ---------------------------------------------------------------------
    async def run(
        self,
        prepared: PreparedRequest,
        candidates: Awaitable[Prediction] | None,
        trace_parent: Context | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """A `TurnDelta` per forward pass that wrote something, then one `TurnResult`.
        `trace_parent`: the caller's `main.generate` span, parent of `candidate.validate`."""
        started = time.perf_counter()
        # Auto mode: the candidates follow the output, text or call (app/drafting/auto_drafts.py).
        auto = self.auto_drafts(prepared)
        feed = CandidateFeed(
            self.engine.store,
            thinking=prepared.reasoning is not None and prepared.reasoning.thinking,
            status="none" if candidates is None else "pending",
            auto=auto,
            suffix=(self.suffixes.of(*suffix_key(prepared))
                    if self.suffixes is not None and prepared.speculate
                    and self.uses_suffix(prepared) else None),
        )
        history_reports: list[CandidateReport] = []
        if prepared.speculate and self.uses_history(prepared):
            history_reports, rendered = await asyncio.to_thread(
                self.history_candidates, prepared, started)
            feed.add(rendered, "history")
        if prepared.speculate and self.config.speculation.schema_drafts:
            if auto is not None:
                auto.schema = self.schema_candidates(prepared)
            else:
                feed.add_schema(self.schema_candidates(prepared))
        receiver = (asyncio.ensure_future(self.receive(feed, prepared, candidates, started,
                                                       trace_parent))
                    if candidates is not None else None)
        tally = GenerationTally(len(prepared.prompt_token_ids), started)
        text_offset = 0  # completions' logprobs count characters from the output's start
        try:
            async for delta in self.engine.stream(
                prepared.prompt_token_ids, dict(prepared.sampling), prepared.speculate,
                feed.on_start, realign=prepared.request.ooo_spec.diagnostics.realign,
                cache_salt=prefix_cache_salt(prepared.tenant, prepared.request.cache_salt),
                sized=prepared.request.ooo_spec.diagnostics.draft_worth,
            ):
                tally.add(delta)
                if feed.prefix is None and delta.text:
                    assert prepared.reasoning is not None
                    so_far = "".join(tally.text)
                    end = prepared.reasoning.ended_at(so_far)
                    if end is not None:
                        feed.reasoning_ended(so_far[:end])
                if delta.text or delta.logprobs:
                    logprobs = (self.shaped_logprobs(prepared, delta.logprobs, text_offset)
                                if delta.logprobs is not None else None)
                    text_offset += len(delta.text)
                    yield TurnDelta(delta.text, logprobs)
        finally:
            if receiver is not None and not receiver.done():
                receiver.cancel()
                if feed.intake.status == "pending":
                    feed.intake = CandidateIntake(status="late")
        # The whole output's logprobs (up to max_tokens x top_logprobs entries) are shaped
        # off the event loop, which streams the other requests meanwhile.
        logprobs = (await asyncio.to_thread(self.shaped_logprobs, prepared, tally.logprobs)
                    if tally.logprobs is not None else None)
        yield self.result(prepared, tally, feed.intake, history_reports, started, logprobs)

    async def complete(
        self, prepared: PreparedRequest, candidates: Awaitable[Prediction] | None = None
    ) -> TurnResult:
        """`run` to its end, for its result alone (offline measurements and tests)."""
        result: TurnResult | None = None
        async for event in self.run(prepared, candidates):
            if isinstance(event, TurnResult):
                result = event
        assert result is not None
        return result

    async def receive(
        self,
        feed: CandidateFeed,
        prepared: PreparedRequest,
        candidates: Awaitable[Prediction],
        started: float,
        trace_parent: Context | None,
    ) -> None:
        """The sidecar's prediction, validated and rendered into `feed` when it arrives
        within `speculation.sidecar_timeout_s`; a late or broken one only means plain decoding."""
        try:
            prediction = await asyncio.wait_for(
                candidates, self.config.speculation.sidecar_timeout_s
            )
            with telemetry.span("candidate.validate", trace_parent) as span:
                # Schema validation off the replica's event loop (other requests' streams).
                intake, rendered = await asyncio.to_thread(
                    self.intake, prepared, prediction, started)
                telemetry.set_attributes(span, telemetry.validation_attributes(
                    intake.status, intake.reports, len(rendered),
                    self.config.telemetry.record_content))
        except TimeoutError:
            feed.intake = CandidateIntake(status="late")
            return
        except Exception as exc:  # a broken sidecar only means plain decoding
            feed.intake = CandidateIntake(status="error", error=f"{type(exc).__name__}: {exc}")
            return
        feed.intake = intake
        if feed.auto is not None and intake.no_call:
            feed.auto.no_call()
        feed.add_prediction(rendered)

    def result(
        self,
        prepared: PreparedRequest,
        tally: GenerationTally,
        intake: CandidateIntake,
        history_reports: list[CandidateReport],
        started: float,
        logprobs: Any = None,
    ) -> TurnResult:
        """The turn's output parsed into calls and content, recorded in the history, with
        its report; `logprobs`: the output's, shaped (`shaped_logprobs`)."""
        result = tally.result()
        drafted = result.speculation.drafted_tokens if result.speculation else 0
        sources = (result.speculation.sources.model_copy(deep=True) if result.speculation
                   else SourceTallies())
        if self.suffixes is not None and self.uses_suffix(prepared):
            # Off the replica's event loop (~0.5 s of Python for a 4,096-token output, which
            # every other request's stream would wait behind), on one writer thread, so a
            # tenant's outputs are added in order.
            tenant, scope = suffix_key(prepared)
            self.suffix_writes = self._suffix_writer.submit(
                self.suffixes.add, tenant, list(result.token_ids), scope)
        if self.format.vllm_backed and prepared.mode in ("auto", "none") \
                and not prepared.raw_prompt and not prepared.calls_in_format:
            # vLLM's own parsers read reasoning, content and calls together, as vllm serve.
            reasoning, parsed = self.vllm_parse(prepared, result.text, result.token_ids)
        else:
            reasoning, answer = (
                prepared.reasoning.split(result.text) if prepared.reasoning is not None
                else (None, result.text)
            )
            parsed = (self.parse(prepared, answer) if answer is not None
                      else ParsedOutput(content=None, calls=[]))
        calls = [Invocation(name=c.name, arguments=c.arguments) for c in parsed.calls]
        if calls and result.finish_reason != "length" and self.uses_history(prepared):
            assert self.history is not None
            self.history.record(
                request_text(prepared.request.message_dicts()), calls, tenant=prepared.tenant,
            )
        return TurnResult(
            text=result.text,
            content=parsed.content,
            reasoning=reasoning,
            calls=calls,
            finish_reason=result.finish_reason,
            stop_reason=result.stop_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=len(result.token_ids),
            token_ids=result.token_ids,
            main=MainReport(
                steps=result.steps,
                completion_tokens=len(result.token_ids),
                drafted_tokens=drafted,
                accepted_tokens=result.accepted_tokens,
                ttft_ms=result.ttft_ms,
                decode_ms=result.decode_ms,
                sources=sources,
                cached_tokens=result.cached_tokens,
            ),
            candidates=history_reports + intake.reports,
            sidecar=SidecarDelivery(
                status=intake.status, error=intake.error, elapsed_ms=intake.sidecar_ms,
                no_call=intake.no_call,
            ),
            main_ms=(time.perf_counter() - started) * 1000,
            logprobs=logprobs,
        )

    def shaped_logprobs(
        self, prepared: PreparedRequest, tokens: list[TokenLogprobs], offset: int = 0
    ) -> Any:
        """Chat's `logprobs.content` list, or a completion choice's `logprobs` object."""
        top = prepared.request.top_logprobs or 0
        if prepared.raw_prompt:
            return completion_logprobs(tokens, top, self.decode_token, offset)
        return chat_logprobs(tokens, top, self.decode_token)

    def decode_token(self, token_id: int) -> str:
        return str(self.engine.tokenizer.decode([token_id]))

    def keeps_special_tokens(self, request: ChatCompletionRequest, mode: str,
                             with_tools: bool) -> bool:
        """As `vllm serve`: the output keeps its special tokens where vLLM's parsers of the
        configured names would ask for them (the markers they read are special tokens in
        Kimi's and gpt-oss's tokenizers, among others). Hand-written formats read none."""
        tool_parser = self.format.name if self.format.vllm_backed else None
        reasoning_parser = self.config.main.engine.reasoning_parser
        if tool_parser is None and reasoning_parser is None:
            return False
        return keeps_special_tokens(
            tool_parser, reasoning_parser, self.engine.tokenizer, with_tools,
            "auto" if mode in ("auto", "none") else "required",
            json.dumps(request.chat_template_kwargs or {}, sort_keys=True))

    def vllm_parse(
        self, prepared: PreparedRequest, text: str, token_ids: list[int]
    ) -> tuple[str | None, ParsedOutput]:
        """(reasoning, content and calls) of an output, by vLLM's parsers of the format's and
        the reasoning parser's names (app/formats/tool_formats/vllm_parsing.py)."""
        reasoning = prepared.reasoning
        parsing = VllmParsing(self.format.name, reasoning.parser if reasoning else None,
                              self.engine.tokenizer)
        found, parsed = parsing.parse(
            text, prepared.tools if prepared.mode == "auto" else None,
            reasoning.vllm_kwargs if reasoning is not None else None, token_ids)
        return found, parsed

    def parse(self, prepared: PreparedRequest, text: str) -> ParsedOutput:
        if prepared.calls_in_format:  # the model wrote its own format: its parser reads it
            return self.format.parse(text, prepared.tools)
        if prepared.mode in ("required", "named"):
            try:
                return parse_forced(text, prepared.request.named_tool)
            except (json.JSONDecodeError, KeyError, TypeError):
                # Only when max_tokens cut the JSON short: give the text back, no calls.
                return ParsedOutput(content=text, calls=[])
        if prepared.mode == "auto":
            return self.format.parse(text, prepared.tools)
        return ParsedOutput(content=text, calls=[])
