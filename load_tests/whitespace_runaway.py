"""How many forced BFCL calls end at `max_tokens`, under vLLM's any-whitespace JSON grammar and
under the bounded-whitespace grammar (`main.json_max_indent`, app/formats/json_grammar.py).

Runs the main engine in-process (no Ray, no HTTP), plain greedy decoding, every case once per
grammar. Run it alone on the machine (it loads a vLLM engine):

    python -m load_tests.whitespace_runaway --limit 100 --out bench_out/whitespace.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from pydantic import BaseModel

from app.config import AppConfig
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from load_tests.bfcl import BfclCase, load_bfcl, score_calls

CATEGORIES = ("simple_python", "multiple")


class CaseResult(BaseModel):
    id: str
    grammar: str  # 'any' | 'bounded'
    finish_reason: str | None
    completion_tokens: int
    parsed: bool  # the output is a complete call
    correct: bool  # BFCL's checker accepts it
    text: str
    seconds: float


class Summary(BaseModel):
    grammar: str
    cases: int
    hit_max_tokens: int
    parsed: int
    correct: int
    median_tokens: float


def summarize(results: list[CaseResult], grammar: str) -> Summary:
    mine = [r for r in results if r.grammar == grammar]
    tokens = sorted(r.completion_tokens for r in mine)
    middle = len(tokens) // 2
    median = (
        0.0 if not tokens else float(tokens[middle]) if len(tokens) % 2
        else (tokens[middle - 1] + tokens[middle]) / 2
    )
    return Summary(
        grammar=grammar,
        cases=len(mine),
        hit_max_tokens=sum(r.finish_reason == "length" for r in mine),
        parsed=sum(r.parsed for r in mine),
        correct=sum(r.correct for r in mine),
        median_tokens=median,
    )


async def run_case(
    service: MainModelService, case: BfclCase, grammar: str, max_tokens: int
) -> CaseResult:
    request = ChatCompletionRequest.model_validate({
        "messages": case.messages, "tools": case.tools, "tool_choice": "required",
        "temperature": 0.0, "max_tokens": max_tokens, "ooo_spec": {"enabled": False},
    })
    started = time.perf_counter()
    final = await service.complete(service.prepare(request))
    calls = final.calls
    return CaseResult(
        id=case.id,
        grammar=grammar,
        finish_reason=final.finish_reason,
        completion_tokens=final.completion_tokens,
        parsed=bool(calls),
        correct=bool(calls) and score_calls(calls, case),
        text=final.text,
        seconds=time.perf_counter() - started,
    )


async def measure(limit: int, max_tokens: int, max_indent: int) -> list[CaseResult]:
    cases = [c for category in CATEGORIES for c in load_bfcl(category, limit)]
    any_ws = AppConfig.model_validate({"main": {"json_max_indent": None}})
    bounded = AppConfig.model_validate({"main": {"json_max_indent": max_indent}})
    service = MainModelService(any_ws)
    service.start()
    results: list[CaseResult] = []
    try:
        for index, case in enumerate(cases):
            # Both grammars on one engine: `prepare` reads the knob per request.
            for grammar, config in (("any", any_ws), ("bounded", bounded)):
                service.config = config
                result = await run_case(service, case, grammar, max_tokens)
                results.append(result)
                print(f"{index + 1}/{len(cases)} {case.id} {grammar}: {result.finish_reason} "
                      f"{result.completion_tokens} tok, parsed={result.parsed}", flush=True)
    finally:
        service.engine.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--limit", type=int, default=100, help="cases per category")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request")
    parser.add_argument("--max-indent", type=int, default=32,
                        help="main.json_max_indent of the bounded grammar")
    parser.add_argument("--out", type=Path, default=Path("bench_out/whitespace.json"),
                        help="the results (JSON)")
    args = parser.parse_args()
    results = asyncio.run(measure(args.limit, args.max_tokens, args.max_indent))
    summaries = [summarize(results, g) for g in ("any", "bounded")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "limit": args.limit, "max_tokens": args.max_tokens, "max_indent": args.max_indent,
        "summaries": [s.model_dump() for s in summaries],
        "cases": [r.model_dump() for r in results],
    }, indent=1))
    for s in summaries:
        print(json.dumps(s.model_dump()))


if __name__ == "__main__":
    main()
