"""A vLLM engine driven in-process by one step-loop thread, with an asyncio face.

Why not `AsyncLLM`: it always runs the engine core (and with it the model runner and our
proposer) in a child process, so candidates arriving in the Serve replica would need an IPC
channel plus a row-to-request map. An in-process `LLMEngine` stepped from a thread shares
memory with the replica: the proposer reads the same `CandidateStore` object the replica writes,
and each step's outputs are exactly one forward pass, which is what `main.steps` counts.
The engine is built and only ever touched on its own thread; callers talk to it through a
command queue. Its arguments come from `engine_args.py` (one pure function per platform).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from app.config import EngineConfig, SidecarLoraConfig, SpeculationConfig
from app.drafting.candidate_store import CandidateStore, RequestSpeculation
from app.engine.cuda_driver import detect_platform
from app.engine.embedded_model import resolve_model_path
from app.engine.engine_args import (
    EngineLaunch,
    apply_env,
    custom_proposer_config,
    engine_launch,
    intra_op_threads,
    with_lora,
)
from app.engine.lora_modules import adapter_runtime_modules, uncovered
from app.engine.pass_ledger import record_pass
from app.formats.logprobs import TokenLogprobs, from_engine

logger = logging.getLogger(__name__)

# The prefix-cache salt of the engine requests made in this context (the sidecar sets it per
# request to the caller's tenant; `stream(cache_salt=...)` wins): vLLM hashes it into the
# first KV block, so cached prefixes are shared within a tenant only and the time to the
# first token says nothing about other tenants' prompts.
CACHE_SALT: ContextVar[str | None] = ContextVar("ooo_spec_cache_salt", default=None)


def use_cache_salt(salt: str | None) -> None:
    """Set `CACHE_SALT` for the current context (a function, so Ray deployments can call it
    without holding the unpicklable ContextVar themselves)."""
    CACHE_SALT.set(salt)


# Whether the engine requests made in this context carry the engine's LoRA adapter (when it
# has one, `sidecar.lora`); the sidecar turns it off per request (`ooo_spec.sidecar_adapter`)
# so a benchmark compares the adapter with the base model on one server.
USE_ADAPTER: ContextVar[bool] = ContextVar("ooo_spec_use_adapter", default=True)




@dataclass
class StepDelta:
    """What one forward pass produced for one request."""

    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    time: float
    # Set on the last delta: what the proposer drafted for this request.
    speculation: RequestSpeculation | None = None
    # Per token, when the request asked for logprobs (app/formats/logprobs.py).
    logprobs: list[TokenLogprobs] | None = None
    # Which of the engine's passes produced it (`VllmEngine.passes` after that pass): what a
    # `PassLedger` counts per prediction (app/engine/pass_ledger.py).
    pass_index: int = 0
    # Prompt tokens vLLM's prefix cache served (vLLM's `num_cached_tokens`, known once the
    # prompt is prefilled): what cache-affinity routing saves (docs/operations.md).
    cached_tokens: int = 0
    # vLLM's `stop_reason` on the last delta: the stop string (or stop token id) that ended it.
    stop_reason: int | str | None = None


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_tokens: int
    steps: int
    ttft_ms: float
    decode_ms: float
    speculation: RequestSpeculation | None
    logprobs: list[TokenLogprobs] | None = None
    cached_tokens: int = 0  # of `prompt_tokens`, served by the prefix cache
    # The stop string that ended the output, if one did (the Messages API's `stop_sequence`).
    stop_reason: str | None = None

    @property
    def accepted_tokens(self) -> int:
        # Every forward pass commits one sampled token plus the drafts it accepted.
        return max(0, len(self.token_ids) - self.steps)


class GenerationTally:
    """Folds one request's step deltas into a `GenerationResult`: the one place that counts
    forward passes, tokens and the time to first token."""

    def __init__(self, prompt_tokens: int, started: float) -> None:
        self.prompt_tokens = prompt_tokens
        self.started = started
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.steps = 0
        self.first: float | None = None
        self.last = started
        self.finish: str | None = None
        self.speculation: RequestSpeculation | None = None
        self.logprobs: list[TokenLogprobs] | None = None
        self.cached_tokens = 0
        self.stop_reason: str | None = None

    def add(self, delta: StepDelta) -> None:
        if delta.token_ids:
            self.steps += 1
            self.tokens.extend(delta.token_ids)
            if self.first is None:
                self.first = delta.time
            self.last = delta.time
        self.text.append(delta.text)
        self.finish = delta.finish_reason or self.finish
        if isinstance(delta.stop_reason, str):  # a stop token's id names no stop string
            self.stop_reason = delta.stop_reason
        self.speculation = delta.speculation or self.speculation
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        if delta.logprobs is not None:
            # Extended in place: a new list per delta made the whole output's cost quadratic.
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)

    def result(self) -> GenerationResult:
        first = self.first or self.last
        return GenerationResult(
            token_ids=self.tokens,
            text="".join(self.text),
            finish_reason=self.finish,
            prompt_tokens=self.prompt_tokens,
            steps=self.steps,
            ttft_ms=(first - self.started) * 1000,
            decode_ms=(self.last - first) * 1000,
            speculation=self.speculation,
            logprobs=self.logprobs,
            cached_tokens=self.cached_tokens,
            stop_reason=self.stop_reason,
        )


class PrefillTally:
    """Prompt tokens this engine prefilled and, of them, the ones its prefix cache served,
    since the deployment last took them for its metrics (`ooo_spec_prompt_tokens`, the hit
    rate per deployment): every request's, the sidecar's slots and waves included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompt = 0
        self._cached = 0

    def add(self, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self._prompt += prompt_tokens
            self._cached += min(cached_tokens, prompt_tokens)

    def take(self) -> tuple[int, int]:
        """(prompt tokens, cached tokens) since the last take."""
        with self._lock:
            taken = (self._prompt, self._cached)
            self._prompt = self._cached = 0
            return taken


def ray_stat_loggers() -> list[Any] | None:
    """vLLM's own Ray stat logger (as Ray Serve LLM uses it): every `vllm:*` metric of this
    engine through `ray.util.metrics`, so Ray's metrics endpoint exports it, tagged with the
    Serve replica (`ReplicaId`) and vLLM's labels (`model_name`, `engine`, and `position` for
    speculative acceptance per draft position); None outside a Ray worker."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger
    except ImportError:
        return None
    return [RayPrometheusStatLogger]


def guard_empty_draft_rows(_worker: Any = None) -> bool:
    """vLLM 0.32 runs its rejection sampler on every step of an engine with speculative
    decoding, drafts or not; without Triton (the CPU build) its top-k over zero drafted rows
    fails (`k.max()` of an empty tensor, `apply_top_k_only`) and kills the step loop with every
    request in flight: one `top_k` request at temperature > 0 in a step without drafts did it.
    With no drafted row there is nothing to constrain, so those logits go back untouched; any
    other step is vLLM's own code. Run in each worker (`collective_rpc`); idempotent."""
    from vllm.v1.sample import rejection_sampler

    original = rejection_sampler.apply_sampling_constraints
    if getattr(original, "ooo_spec_guarded", False):
        return True

    def guarded(logits: Any, cu_num_draft_tokens: Any, sampling_metadata: Any) -> Any:
        if logits.shape[0] == 0:
            return logits
        return original(logits, cu_num_draft_tokens, sampling_metadata)

    guarded.ooo_spec_guarded = True  # type: ignore[attr-defined]
    rejection_sampler.apply_sampling_constraints = guarded
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        # Without Triton the per-request temperature, top-k and top-p reached the drafted rows
        # as uninitialised values (a top-k row indexed -512097393 and killed the step loop):
        # the expansion in PyTorch, as its docstring defines it.
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> Any:
    """vLLM's `expand_batch_to_tokens` in PyTorch: each request's value once per drafted row
    (`x = [a, b, c]`, `cu_num_tokens = [2, 5, 6]` -> `[a, a, b, b, b, c]`), `replace_from`
    replaced by `replace_to`."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


_DRAFT_FREE_PARAMS: Any = None


def draft_free_params_type() -> Any:
    """vLLM's `SamplingParams` without its refusal of `min_p` and `logit_bias` on an engine
    with speculative decoding, for requests this engine never drafts for (the store holds
    them disabled). vLLM refuses those fields because its rejection sampler does not apply
    them to drafted rows; a row without drafts is sampled by vLLM's plain `Sampler` (the
    bonus token: every logits processor, min_p and logit_bias included), so the output is
    plain decoding's (tests/integration/test_lossless.py)."""
    global _DRAFT_FREE_PARAMS
    if _DRAFT_FREE_PARAMS is None:
        from vllm import SamplingParams

        class DraftFreeSamplingParams(SamplingParams):  # type: ignore[misc]
            def _validate_spec_decode(self, speculative_config: Any) -> None:
                return None

        _DRAFT_FREE_PARAMS = DraftFreeSamplingParams
    return _DRAFT_FREE_PARAMS


class EngineError(RuntimeError):
    pass


class RequestRejected(ValueError):
    """The engine refused the request itself (vLLM's client errors, e.g. a JSON schema it
    cannot compile into a grammar): the request's fault, not the server's."""


def _pooled(tokenizer: Any, copies: int) -> Any:
    from vllm.tokenizers.hf import maybe_make_thread_pool

    return maybe_make_thread_pool(tokenizer, copies)


def with_chat_template(tokenizer: Any, template: str) -> Any:
    """`tokenizer` rendering chats with `template`. vLLM wraps the engine's tokenizer twice (a
    cache of its properties, then a pool of deep copies that `apply_chat_template` goes
    through, vllm/tokenizers/hf.py), and a copy is rebuilt from the unwrapped tokenizer, so an
    attribute set on the wrapper never reaches the copies that render. The template is set on
    the unwrapped tokenizer (a copy of it) and the wrappers are applied again."""
    from vllm.tokenizers.hf import get_cached_tokenizer, maybe_make_thread_pool

    wrappers: list[Callable[[Any], Any]] = []
    inner = tokenizer
    while "__reduce__" in vars(type(inner)):  # vLLM's wrappers say how they were built
        rebuild, args = inner.__reduce__()[:2]
        if rebuild is maybe_make_thread_pool:
            wrappers.append(functools.partial(_pooled, copies=args[1]))
        elif rebuild is get_cached_tokenizer:
            wrappers.append(get_cached_tokenizer)
        else:
            break
        inner = args[0]
    inner = copy.copy(inner)
    inner.chat_template = template
    for wrap in reversed(wrappers):
        inner = wrap(inner)
    return inner


class VllmEngine:
    """One vLLM engine. `speculation` set = main model with the candidate proposer;
    `vllm_speculative` set instead = vLLM's own speculative method (the n-gram baseline)."""

    def __init__(
        self,
        cfg: EngineConfig,
        speculation: SpeculationConfig | None = None,
        vllm_speculative: dict[str, Any] | None = None,
        lora: SidecarLoraConfig | None = None,
    ) -> None:
        """`lora`: an adapter every request carries (the sidecar's; vLLM's LoRA support)."""
        if speculation is not None and vllm_speculative is not None:
            raise ValueError("an engine has either the candidate proposer or vLLM's own method")
        self.cfg = cfg
        self.speculation = speculation
        self.vllm_speculative = vllm_speculative
        self.lora = lora
        self.lora_request: Any = None  # vLLM's LoRARequest for `lora`, built with the engine
        # The modules vLLM wraps for LoRA (`sidecar.lora.modules`); None: every one it can.
        self.lora_modules: list[str] | None = None
        self.store = CandidateStore()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._fatal: BaseException | None = None
        self.aborted = 0  # requests given up before they finished (cancelled, dropped)
        # Forward passes that wrote tokens so far (engine thread writes, anyone reads), every
        # request's: one request's own passes are counted from its deltas' `pass_index`
        # (app/engine/pass_ledger.py). A step can run no model at all (every request waiting
        # for its grammar): only steps with outputs count.
        self.passes = 0
        # external -> internal id of the requests in the engine; engine thread only
        self._internal_ids: dict[str, str] = {}
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.launch: EngineLaunch | None = None
        self._build_error: BaseException | None = None
        # Serves the store to a tensor-parallel engine's worker processes (None: in-process).
        self._store_server: Any = None
        self.prefills = PrefillTally()

    # ----- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Build the engine and start stepping it (blocking, seconds to minutes).

        The step-loop thread builds the engine itself and only then serves: on CUDA, vLLM's
        current stream is per thread and CUDA graphs are captured during the build, so the
        thread that steps must be the one that built. A build error is raised here.
        """
        lora_errors = self.lora.errors() if self.lora is not None else []
        if lora_errors:
            # vLLM would only fail at the first request; a replica without it must not start.
            raise EngineError("; ".join(lora_errors))
        platform = detect_platform()
        self.model_path = resolve_model_path(self.cfg.model)
        speculative = (
            custom_proposer_config(self.speculation)
            if self.speculation is not None
            else self.vllm_speculative
        )
        self.launch = engine_launch(platform, self.cfg, self.model_path, speculative)
        if self.lora is not None:
            if self.lora.modules == "adapter":
                self.lora_modules = adapter_runtime_modules(self.lora.path, self.model_path)
            self.launch = with_lora(self.launch, self.lora.max_rank, self.lora_modules)
        apply_env(self.launch, os.environ)
        threads = intra_op_threads(self.launch, os.environ)
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if platform == "cuda":
            from app.engine.cuda_driver import check_driver

            check_driver()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="vllm-step-loop", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    def _build(self) -> None:
        """Build the engine and bind the proposer (engine thread)."""
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        assert self.launch is not None, "start() sets the launch before the thread runs"
        kwargs = dict(self.launch.kwargs)
        loggers = None
        if not kwargs.get("disable_log_stats", True):
            loggers = ray_stat_loggers()
            # Outside a Ray worker nothing would export them: no stats, no per-step cost.
            kwargs["disable_log_stats"] = loggers is None
        self.engine = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=loggers)
        if self.speculation is not None or self.vllm_speculative is not None:
            self.engine.collective_rpc(guard_empty_draft_rows)
        self.tokenizer = self.engine.get_tokenizer()
        if self.cfg.chat_template is not None:  # prompts and drafted calls go through it
            from app.formats.tool_formats.families import load_chat_template

            self.tokenizer = with_chat_template(self.tokenizer,
                                                load_chat_template(self.cfg.chat_template))
        if self.lora is not None:
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest("ooo-spec-adapter-1", 1, self.lora.path)
        if self.speculation is not None:
            from app.drafting.candidate_proposer import bind_proposer
            from app.drafting.draft_policy import DraftPolicy

            settings = (
                self.tokenizer,
                self.speculation.prompt_lookup_fallback,
                self.speculation.prompt_lookup_min,
                self.speculation.prompt_lookup_max,
                DraftPolicy.from_config(self.speculation, self.launch.platform),
            )
            if self.cfg.tensor_parallel_size > 1:
                # The ranks are worker processes: the output rank's proposer reads this store
                # through a local socket (app/drafting/candidate_channel.py).
                from app.drafting.candidate_channel import StoreServer, bind_remote_proposer

                self._store_server = StoreServer(self.store)
                bound = self.engine.collective_rpc(
                    bind_remote_proposer,
                    args=(self._store_server.address, self._store_server.authkey, *settings),
                )
            else:
                bound = self.engine.collective_rpc(bind_proposer, args=(self.store, *settings))
            if not all(bound):
                raise EngineError("the candidate proposer is not reachable from the replica")

    def _run(self, ready: threading.Event) -> None:
        try:
            self._build()
        except BaseException as exc:  # raised again by start(), on the caller's thread
            self._build_error = exc
            return
        finally:
            ready.set()
        self._loop()

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(("wake", None))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        if self.engine is not None and (thread is None or not thread.is_alive()):
            # Tear the engine down now: left to the garbage collector, vLLM's teardown
            # (cleanup_dist_env_and_memory) would reset the process-wide parallel groups under
            # whichever engine was started in this process after this one.
            engine, self.engine = self.engine, None
            engine.engine_core.shutdown()
        if self._store_server is not None:
            self._store_server.close()
            self._store_server = None

    def swap_adapter(self, path: str) -> None:
        """Serve the adapter at `path` from the next request on, without rebuilding the engine:
        a new LoRARequest id, which vLLM loads beside the model on first use (requests already
        running finish with the adapter they started with)."""
        from vllm.lora.request import LoRARequest

        if self.lora is None or self.lora_request is None:
            raise EngineError("this engine was built without LoRA: set sidecar.lora and restart")
        if path == self.lora.path:
            return
        lora = self.lora.model_copy(update={"path": path})
        lora_errors = lora.errors()
        if lora_errors:
            raise EngineError("; ".join(lora_errors))
        # With every layer wrapped (`modules: all`) any adapter fits: nothing to read.
        missing = ([] if self.lora_modules is None else
                   uncovered(adapter_runtime_modules(path, self.model_path), self.lora_modules))
        if missing:
            # vLLM would silently leave those layers of the adapter out.
            raise EngineError(
                f"the adapter at {path} has layers this engine did not wrap for LoRA "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): restart "
                "the replicas with it as sidecar.lora.path, or set sidecar.lora.modules: all"
            )
        number = self.lora_request.lora_int_id + 1
        self.lora, self.lora_request = lora, LoRARequest(f"ooo-spec-adapter-{number}", number,
                                                         path)

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._fatal is None

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of `messages` through the model's chat template, ready for an answer."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def num_unfinished(self) -> int:
        """Requests the engine still holds (engine's own count), for leak checks."""
        return int(self.engine.get_num_unfinished_requests()) if self.engine else 0

    def counters(self) -> dict[str, int]:
        """Leak checks: requests in the engine, open streams and candidate entries here (all
        0 when idle), and the running count of aborted requests."""
        return {"unfinished": self.num_unfinished(), "streams": len(self._streams),
                "store": len(self.store), "aborted": self.aborted}

    # ----- step loop (engine thread only) ------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                busy = self.engine.has_unfinished_requests()
                self._drain_commands(block=not busy)
                if not self.engine.has_unfinished_requests():
                    continue
                outputs = self.engine.step()
                self.passes += bool(outputs)
                now = time.perf_counter()
                for out in outputs:
                    self._deliver(out, now)
        except BaseException as exc:  # the engine is unusable: fail every waiter clearly
            logger.exception("vLLM step loop died")
            self._fatal = exc
            for loop, q in list(self._streams.values()):
                loop.call_soon_threadsafe(q.put_nowait, EngineError(f"engine failed: {exc}"))
            self._streams.clear()

    def _drain_commands(self, block: bool) -> None:
        try:
            cmd, arg = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd == "add":
                request_id, prompt, params, adapter, priority, reply = arg
                try:
                    internal = self.engine.add_request(
                        request_id, prompt, params,
                        lora_request=self.lora_request if adapter else None,
                        priority=priority,
                    )
                    reply(internal, None)
                except Exception as exc:  # bad params: tell the caller, keep serving
                    reply(None, exc)
            elif cmd == "abort":
                self.engine.abort_request([arg])
                # Also what a request cancelled before its add was confirmed left behind.
                self._streams.pop(arg, None)
                internal = self._internal_ids.pop(arg, None)
                if internal is not None:
                    self.store.close(internal)
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return

    def _deliver(self, out: Any, now: float) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        completion = out.outputs[0]
        delta = StepDelta(
            token_ids=list(completion.token_ids),
            text=completion.text,
            finished=bool(out.finished),
            finish_reason=completion.finish_reason,
            time=now,
            logprobs=(from_engine(list(completion.token_ids), completion.logprobs)
                      if completion.logprobs is not None else None),
            pass_index=self.passes,
            cached_tokens=int(out.num_cached_tokens or 0),
            stop_reason=completion.stop_reason,
        )
        loop, q = stream
        loop.call_soon_threadsafe(q.put_nowait, delta)
        if out.finished:
            self._streams.pop(out.request_id, None)
            self._internal_ids.pop(out.request_id, None)

    # ----- public async API --------------------------------------------------------------
    async def stream(
        self,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        speculate: bool = False,
        on_start: Any = None,
        realign: bool = True,
        cache_salt: str | None = None,
        sized: bool = True,
    ) -> AsyncGenerator[StepDelta, None]:
        """Yield one `StepDelta` per forward pass that produced tokens for this request.

        `on_start(internal_request_id)` runs once the engine has the request (the id the
        candidate store and proposer use). Cancelling the iterator aborts the request.
        """
        if self._fatal is not None or self.engine is None:
            raise EngineError("engine is not running")
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        options = dict(sampling)
        schema = options.pop("structured_json", None)
        choice = options.pop("structured_choice", None)
        regex = options.pop("structured_regex", None)
        grammar = options.pop("structured_grammar", None)
        tag = options.pop("structured_tag", None)
        if grammar is not None:  # EBNF (app/formats/json_grammar.py)
            options["structured_outputs"] = StructuredOutputsParams(grammar=grammar)
        elif tag is not None:  # a structural tag's JSON (app/formats/structural_tag.py)
            options["structured_outputs"] = StructuredOutputsParams(structural_tag=tag)
        elif schema is not None:
            options["structured_outputs"] = StructuredOutputsParams(json=schema)
        elif choice is not None:
            options["structured_outputs"] = StructuredOutputsParams(choice=choice)
        elif regex is not None:
            options["structured_outputs"] = StructuredOutputsParams(regex=regex)
        priority = int(options.pop("priority", 0))
        params_type = (draft_free_params_type() if not speculate and self.speculation is not None
                       and (options.get("min_p") or options.get("logit_bias"))
                       else SamplingParams)
        params = params_type(**options, output_kind=RequestOutputKind.DELTA)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()
        added: asyncio.Future[str] = loop.create_future()

        def reply(internal: str | None, exc: Exception | None) -> None:
            def settle() -> None:
                if added.done():
                    return
                if exc is not None:
                    added.set_exception(exc)
                else:
                    added.set_result(internal or "")

            loop.call_soon_threadsafe(settle)

        external_id = f"req-{next(self._ids)}"
        internal_id: str | None = None
        finished = False
        try:
            # Outputs come back under the external id; the model runner (and so the proposer
            # and the store) sees the internal one. Both are registered on the engine thread
            # right after the add, before the first step can run.
            def reply_and_register(internal: str | None, exc: Exception | None) -> None:
                if internal is not None:
                    self._streams[external_id] = (loop, q)
                    self._internal_ids[external_id] = internal
                    self.store.open(internal, enabled=speculate, realign=realign,
                                    sized=sized)
                reply(internal, exc)

            prompt: dict[str, Any] = {"prompt_token_ids": prompt_token_ids}
            salt = cache_salt if cache_salt is not None else CACHE_SALT.get()
            if salt is not None:
                prompt["cache_salt"] = salt
            self._commands.put(
                ("add", (external_id, prompt, params, USE_ADAPTER.get(), priority,
                         reply_and_register))
            )
            try:
                internal_id = await added
            except Exception as exc:
                from vllm.exceptions import VLLMClientError

                if isinstance(exc, VLLMClientError | ValueError):
                    raise RequestRejected(str(exc)) from exc
                raise
            if on_start is not None:
                on_start(internal_id)
            prefilled = False
            while True:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                if item.token_ids:
                    record_pass(item.pass_index)
                    if not prefilled:  # the first tokens come after the whole prompt's prefill
                        prefilled = True
                        self.prefills.add(len(prompt_token_ids), item.cached_tokens)
                if item.finished:
                    item.speculation = self.store.close(internal_id)
                    internal_id = None
                    finished = True
                    yield item
                    return
                yield item
        finally:
            if internal_id is not None:
                self._streams.pop(external_id, None)
                self.store.close(internal_id)
                self._commands.put(("abort", external_id))
                self.aborted += 1
            elif not finished:
                # Cancelled while the add was on its way: the add is queued ahead of this abort.
                self._commands.put(("abort", external_id))

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        speculate: bool = False,
        on_start: Any = None,
    ) -> GenerationResult:
        tally = GenerationTally(len(prompt_token_ids), time.perf_counter())
        async for delta in self.stream(prompt_token_ids, sampling, speculate, on_start):
            tally.add(delta)
        return tally.result()
