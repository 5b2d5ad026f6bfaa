"""How long one tenant's grammar check waits while another tenant floods the check pool.

Tenant A sends `--flood` forced-call grammars at once, each of `--properties` strings with long,
distinct `maxLength`s (about 2 s of xgrammar compile per property on the embedded model's
vocabulary); once A's first answer is back (its compile refused at `--limit` seconds of CPU),
tenant B checks a small fresh grammar. Both pools run in one process, one after the other, on
the same grammars:

- `fair`: the default check pool (`limits.check_threads`, `limits.check_threads_per_tenant`);
- `no-share`: 2 threads, either tenant may hold both (as the pre-check was before the pool).

No model or server: the main replica's `GrammarCheck` with the embedded model's tokenizer.

    python -m load_tests.check_pool_fairness [--flood 4] [--properties 6] [--limit 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass

from app.check_pool import CheckPool
from app.config import LimitsConfig
from app.formats.grammar_check import GrammarCheck, GrammarTooSlow, tokenizer_info
from app.formats.json_grammar import bounded_whitespace_grammar


@dataclass
class Outcome:
    mode: str
    flood_first_s: float  # A's first answer, from the flood's start
    b_ok: bool
    b_wait_s: float  # B's check, from when B asked
    flood_refused: int


def slow_grammar(index: int, properties: int) -> str:
    lengths = {f"f{i}": {"type": "string", "maxLength": 2000 + properties * index + i}
               for i in range(properties)}
    return bounded_whitespace_grammar(
        {"type": "object", "properties": lengths, "required": list(lengths)}, 32)


async def check(pool_check: GrammarCheck, grammar: str, tenant: str) -> tuple[bool, float]:
    started = time.perf_counter()
    try:
        await pool_check.check_ebnf(grammar, tenant)
        return True, time.perf_counter() - started
    except GrammarTooSlow:
        return False, time.perf_counter() - started


async def run(mode: str, pool_check: GrammarCheck, grammars: list[str], small: str) -> Outcome:
    started = time.perf_counter()
    flood = [asyncio.ensure_future(check(pool_check, g, "tenant-a")) for g in grammars]
    await asyncio.wait(flood, return_when=asyncio.FIRST_COMPLETED)
    first = time.perf_counter() - started
    b_ok, b_wait = await check(pool_check, small, "tenant-b")
    answers = await asyncio.gather(*flood)
    pool_check.pool.close()  # its refused compiles end before the next mode starts
    return Outcome(mode, first, b_ok, b_wait, sum(not ok for ok, _ in answers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--flood", type=int, default=4, help="tenant A's grammars at once")
    parser.add_argument("--properties", type=int, default=6, help="long strings per grammar")
    parser.add_argument("--limit", type=float, default=2.0, help="CPU seconds per compile")
    parser.add_argument("--max-wait", type=float, default=30.0, help="longest wait per check")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from app.engine.embedded_model import resolve_model_path

    info = tokenizer_info(AutoTokenizer.from_pretrained(resolve_model_path("embedded")), None)
    limits = LimitsConfig()
    pools = {"fair": lambda: CheckPool(limits.check_threads, limits.check_threads_per_tenant,
                                       "fair"),
             "no-share": lambda: CheckPool(2, 2, "no-share")}
    for index, (mode, pool) in enumerate(pools.items()):
        # Fresh grammars per mode: nothing remembered, nothing cached by xgrammar.
        grammars = [slow_grammar(index * args.flood + k, args.properties)
                    for k in range(args.flood)]
        fresh = f"q_{uuid.uuid4().hex[:8]}"
        small = bounded_whitespace_grammar(
            {"type": "object", "properties": {fresh: {"type": "string"}}, "required": [fresh]},
            32)
        outcome = asyncio.run(run(mode, GrammarCheck(info, args.limit, args.max_wait, pool()),
                                  grammars, small))
        print(f"{outcome.mode:>8}: A's first answer after {outcome.flood_first_s:5.1f} s; "
              f"B {'answered' if outcome.b_ok else 'REFUSED'} after {outcome.b_wait_s:5.2f} s; "
              f"A refused {outcome.flood_refused}/{args.flood}", flush=True)


if __name__ == "__main__":
    main()
