"""Compile a forced call's grammar before the engine sees it, with a CPU-time limit.

vLLM 0.32 compiles structured-output grammars (xgrammar) in its own thread pool, one worker
per two cores, and keeps the request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` until the
compile ends, however long that is: one slow grammar (a schema of bounded repeats, say) holds
the pool, and every forced call behind it waits. Here the same compile runs first in a worker
thread of our own (xgrammar releases the GIL, so the event loop and the engine's step thread
keep going); once it has spent `timeout_s` of CPU time, or `max_wait_s` have passed, the
request is refused with a 400 and never reaches the engine. The limit is on CPU time
(app/cpu_budget.py) because the verdict is about the schema: on a loaded machine a 9 ms compile
has been refused at a 5 s wall-clock limit. A compile that was refused still finishes in its
thread (it cannot be interrupted); the schema caps (app.api.limits) bound how long that takes.

Schemas that compiled in time are remembered (by their JSON text), so the tools a client sends
on every request are checked once.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.cpu_budget import OverBudget, run_with_cpu_budget

logger = logging.getLogger(__name__)

_REMEMBERED = 1024


class GrammarTooSlow(Exception):
    """The grammar did not compile within the limit."""


def tokenizer_info(tokenizer: Any, vocab_size: int | None) -> Any:
    """The `xgrammar.TokenizerInfo` of a Hugging Face tokenizer, as vLLM's backend builds it."""
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)


class GrammarCheck:
    def __init__(self, info: Any, timeout_s: float, max_wait_s: float) -> None:
        """`info`: the engine's vocabulary as an `xgrammar.TokenizerInfo` (`tokenizer_info`);
        `timeout_s`: the compile's CPU time; `max_wait_s`: the wait, however little CPU."""
        import xgrammar as xgr

        # No cache of its own: the verdicts are remembered below, and a cache would hold
        # compiled grammars the engine compiles (and caches) again anyway.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-check")
        self._fast: OrderedDict[str, None] = OrderedDict()

    def _compile(self, kind: str, text: str) -> None:
        try:
            if kind == "json":
                self._compiler.compile_json_schema(text, any_whitespace=True)
            else:
                self._compiler.compile_grammar(text)
        except Exception:  # noqa: BLE001 - the engine reports an uncompilable grammar itself
            logger.debug("grammar check: the grammar does not compile", exc_info=True)

    async def check(self, schema: dict[str, Any]) -> None:
        """Return once `schema`'s grammar compiled within the limit; raise `GrammarTooSlow`
        otherwise."""
        await self._check("json", json.dumps(schema, sort_keys=True, separators=(",", ":")))

    async def check_ebnf(self, grammar: str) -> None:
        """The same for a grammar given as EBNF (the bounded-whitespace JSON grammar of
        app/engine/json_grammar.py, which forced calls use by default)."""
        await self._check("ebnf", grammar)

    async def _check(self, kind: str, text: str) -> None:
        key = f"{kind}:{text}"
        if key in self._fast:
            self._fast.move_to_end(key)
            return
        try:
            await run_with_cpu_budget(lambda: self._compile(kind, text), self.timeout_s,
                                      self.max_wait_s, self._pool)
        except OverBudget as over:
            raise GrammarTooSlow(f"the grammar did not compile within {self.timeout_s:g} s of "
                                 f"CPU time ({over})") from None
        self._fast[key] = None
        if len(self._fast) > _REMEMBERED:
            self._fast.popitem(last=False)
