"""Compile a forced call's grammar before the engine sees it, with a CPU-time limit.

vLLM 0.32 compiles structured-output grammars (xgrammar) in its own thread pool, one worker
per two cores, and keeps the request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` until the
compile ends, however long that is: one slow grammar (a schema of bounded repeats, say) holds
the pool, and every forced call behind it waits. Here the same compile runs first in a
replica's check pool (app/check_pool.py: a few threads, shared by identical requests, at most
`per_tenant` of them for one tenant, served round-robin over tenants; xgrammar releases the GIL,
so the event loop and the engine's step thread keep going); once it has spent `timeout_s` of
CPU time, or `max_wait_s` have passed, the request is refused with a 400 and never reaches the
engine. The limit is on CPU time (app/cpu_budget.py) because the verdict is about the schema:
on a loaded machine a 9 ms compile has been refused at a 5 s wall-clock limit. A compile that
was refused still finishes in its thread (it cannot be interrupted), holding its tenant's share
of the pool until then; the schema caps (app.api.limits) bound how long that takes.

Verdicts are remembered per tenant (by the grammar's text), each tenant in its own share of
the cache: the tools a client sends on every request are checked once, a grammar that spent
the CPU limit is refused at once the next time instead of being compiled again, and one
tenant's stream of new schemas never evicts another tenant's verdicts. The main replica
checks the forced call's grammar (JSON, or the structural tag of the model's own format,
app/formats/structural_tag.py, as its bounded EBNF or as the tag itself), the sidecar the
grammars of its own engine requests (union, slots, names, verify).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from app.check_pool import CheckPool
from app.config import LimitsConfig
from app.cpu_budget import OverBudget
from app.tenancy import TenantLru

logger = logging.getLogger(__name__)

# Verdicts kept per replica, and of those per tenant: one tenant's stream of distinct
# schemas evicts its own verdicts, never another tenant's (app/tenancy.py `TenantLru`).
_REMEMBERED = 1024
_REMEMBERED_PER_TENANT = 256

GrammarKind = Literal["json", "ebnf", "regex", "structural_tag"]


class GrammarTooSlow(Exception):
    """The grammar did not compile within the limit."""


def tokenizer_info(tokenizer: Any, vocab_size: int | None) -> Any:
    """The `xgrammar.TokenizerInfo` of a Hugging Face tokenizer, as vLLM's backend builds it."""
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)


def engine_grammar_check(engine: Any, limits: LimitsConfig, name: str) -> GrammarCheck:
    """The grammar check of a started engine's replica (`name`: its check pool's), sized by
    the model's vocabulary as vLLM's structured-output backend sizes it."""
    config = getattr(getattr(engine, "engine", None), "model_config", None)
    vocab = config.get_vocab_size() if config is not None else None
    return GrammarCheck(tokenizer_info(engine.tokenizer, vocab), limits.grammar_compile_timeout_s,
                        limits.check_max_wait_s, check_pool(limits, name))


def check_pool(limits: LimitsConfig, name: str) -> CheckPool:
    """A replica's check pool as `limits` size it (`check_threads`, `check_threads_per_tenant`,
    the latter at most the former)."""
    return CheckPool(limits.check_threads,
                     min(limits.check_threads_per_tenant, limits.check_threads), name)


class GrammarCheck:
    def __init__(self, info: Any, timeout_s: float, max_wait_s: float, pool: CheckPool) -> None:
        """`info`: the engine's vocabulary as an `xgrammar.TokenizerInfo` (`tokenizer_info`);
        `timeout_s`: the compile's CPU time; `max_wait_s`: the wait, however little CPU;
        `pool`: the replica's check pool the compiles run in."""
        import xgrammar as xgr

        # No cache of its own: the verdicts are remembered below, and a cache would hold
        # compiled grammars the engine compiles (and caches) again anyway.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s
        self.pool = pool
        # Per tenant, (kind, text) -> whether it compiled within the limit.
        self._verdicts: TenantLru[tuple[str, str], bool] = TenantLru(_REMEMBERED_PER_TENANT,
                                                                      _REMEMBERED)

    def _compile(self, kind: GrammarKind, text: str) -> None:
        try:
            if kind == "json":
                self._compiler.compile_json_schema(text, any_whitespace=True)
            elif kind == "regex":
                self._compiler.compile_regex(text)
            elif kind == "structural_tag":  # app/formats/structural_tag.py
                self._compiler.compile_structural_tag(text)
            else:
                self._compiler.compile_grammar(text)
        except Exception:  # noqa: BLE001 - the engine reports an uncompilable grammar itself
            logger.debug("grammar check: the grammar does not compile", exc_info=True)

    async def check(self, schema: dict[str, Any], tenant: str) -> None:
        """Return once `schema`'s grammar compiled within the limit; raise `GrammarTooSlow`
        otherwise."""
        await self.check_text("json", json.dumps(schema, sort_keys=True, separators=(",", ":")),
                              tenant)

    async def check_ebnf(self, grammar: str, tenant: str) -> None:
        """The same for a grammar given as EBNF (the bounded-whitespace JSON grammar of
        app/formats/json_grammar.py, which forced calls use by default)."""
        await self.check_text("ebnf", grammar, tenant)

    async def check_sampling(self, sampling: dict[str, Any], tenant: str) -> None:
        """The same for whichever grammar an engine request's sampling options carry
        (`structured_json`, `structured_grammar`, `structured_regex` or `structured_tag`, a
        structural tag's JSON), if any."""
        if (schema := sampling.get("structured_json")) is not None:
            await self.check(schema, tenant)
        elif (grammar := sampling.get("structured_grammar")) is not None:
            await self.check_ebnf(grammar, tenant)
        elif (regex := sampling.get("structured_regex")) is not None:
            await self.check_text("regex", regex, tenant)
        elif (tag := sampling.get("structured_tag")) is not None:
            await self.check_text("structural_tag", tag, tenant)

    async def check_text(self, kind: GrammarKind, text: str, tenant: str) -> None:
        key = (kind, text)
        verdict = self._verdicts.get(tenant, key)
        if verdict is not None:
            if verdict:
                return
            raise GrammarTooSlow(f"the grammar did not compile within {self.timeout_s:g} s of "
                                 "CPU time (refused before)")
        try:
            await self.pool.run(tenant, ("grammar", kind, text),
                                lambda: self._compile(kind, text), self.timeout_s,
                                self.max_wait_s)
        except OverBudget as over:
            if over.cpu_s >= self.timeout_s:  # the schema's fault, not the wait's: final
                self._verdicts.put(tenant, key, False)
            raise GrammarTooSlow(f"the grammar did not compile within {self.timeout_s:g} s of "
                                 f"CPU time ({over})") from None
        self._verdicts.put(tenant, key, True)
