"""The sidecar's slot prediction against plain's committed calls, in this process.

One sidecar engine (the sidecar of `--config`: its settings and adapter), the first `--limit`
cases of each `--categories`, and the calls plain committed for them, read from a bench run's
records (`load_tests.bench ... --modes plain,...`). Every case is predicted one at a time with
the adapter and without (`--adapters`), and compared as the benchmark's `sidecar` mode compares
(`bench.same_calls` on the first candidate):

    python -m load_tests.sidecar_agreement --bench bench_out/run/bench-*.json \
        --config distill_out/bench.yaml --limit 100 --set waves=2

A quick look at a setting or an adapter (minutes, not the bench's hour): agreement carries over
to the bench; the times are the sidecar's alone, one request at a time, not the bench's
readiness (which counts from the router's fan-out, beside the main model's decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.speculation.canonical import Invocation


def plain_records(bench_file: Path) -> list[dict[str, Any]]:
    """A bench run's measured plain records that committed a call."""
    records = json.loads(bench_file.read_text(encoding="utf-8"))["records"]
    return [r for r in records if r["mode"] == "plain" and not r["warmup"] and r["tool_calls"]]


def plain_calls(bench_file: Path) -> dict[str, list[Invocation]]:
    """Case id -> the calls plain committed, from a bench run's records."""
    return {r["case_id"]: [Invocation(name=c["name"], arguments=json.loads(c["arguments"]))
                           for c in r["tool_calls"]]
            for r in plain_records(bench_file)}


def plain_steps(bench_file: Path) -> dict[str, int]:
    """Case id -> plain's forward passes to its committed call (a forced call is the whole
    output), from a bench run's records."""
    return {r["case_id"]: int(r["steps"]) for r in plain_records(bench_file) if r["steps"]}


@dataclass
class Tally:
    """One (category, adapter) cell of the table."""

    cases: int = 0
    whole: int = 0
    required: int = 0
    other_tool: int = 0
    times_ms: list[float] = field(default_factory=list)
    # The sidecar's forward passes per prediction (`Prediction.passes`) and plain's to its
    # call on the same cases.
    passes: list[int] = field(default_factory=list)
    plain_steps: list[int] = field(default_factory=list)

    def line(self, label: str) -> str:
        def share(n: int) -> str:
            return f"{n}/{self.cases} ({n / max(1, self.cases):.0%})"

        def median(values: Sequence[float]) -> float:
            return statistics.median(values) if values else 0.0

        passes, steps = median(self.passes), median(self.plain_steps)
        return (f"{label:28s} whole {share(self.whole):14s} required {share(self.required):14s}"
                f" other tool {self.other_tool:3d}  prediction (median) "
                f"{median(self.times_ms):5.0f} ms, {passes:4.1f} passes vs plain's "
                f"{steps:4.1f} ({passes / steps if steps else 0:.2f}x)")


def sidecar_args(config_file: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The app args of `config_file` the sidecar needs, with `sidecar.<key>=<JSON value>`
    overrides."""
    import yaml

    args = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
    app_args: dict[str, Any] = args["applications"][0]["args"]
    kept: dict[str, Any] = {k: app_args[k] for k in ("sidecar", "limits") if k in app_args}
    sidecar = dict(kept.get("sidecar") or {})
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            sidecar[key] = json.loads(value)
        except json.JSONDecodeError:
            sidecar[key] = value  # a bare word: a string setting (`choice_prompt=names`)
    kept["sidecar"] = sidecar
    return kept


async def measure(app_args: dict[str, Any], plain: dict[str, list[Invocation]],
                  steps: dict[str, int], categories: Sequence[str], limit: int,
                  adapters: Sequence[bool]) -> dict[tuple[str, bool], Tally]:
    from app.config import AppConfig
    from app.distill.collect import DistillCase, request_body
    from app.openai_models import ChatCompletionRequest
    from app.sidecar.service import SidecarService
    from load_tests.bench import same_calls
    from load_tests.bfcl import load_bfcl

    service = SidecarService(AppConfig.model_validate(app_args))
    service.start()
    tallies: dict[tuple[str, bool], Tally] = {}
    try:
        for category in categories:
            for case in [c for c in load_bfcl(category)[:limit] if c.id in plain]:
                body = request_body(DistillCase(id=case.id, source=f"bfcl:{category}",
                                                messages=case.messages, tools=case.tools))
                schemas = {t["function"]["name"]: t["function"].get("parameters") or {}
                           for t in case.tools}
                main = plain[case.id]
                for adapter in adapters:
                    body["ooo_spec"] = {"diagnostics": {"sidecar_adapter": adapter}}
                    request = ChatCompletionRequest.model_validate(body)
                    prediction = await service.predict(request)
                    first = prediction.candidates[0] if prediction.candidates else []
                    predicted = [Invocation(name=c.name, arguments=dict(c.arguments))
                                 for c in first]
                    tally = tallies.setdefault((category, adapter), Tally())
                    tally.cases += 1
                    tally.whole += same_calls(predicted, main, schemas, required_only=False)
                    tally.required += same_calls(predicted, main, schemas, required_only=True)
                    tally.other_tool += bool(predicted) and predicted[0].name != main[0].name
                    tally.times_ms.append(prediction.elapsed_ms)
                    tally.passes.append(prediction.passes)
                    if case.id in steps:
                        tally.plain_steps.append(steps[case.id])
    finally:
        service.engine.stop()
    return tallies


def report(tallies: dict[tuple[str, bool], Tally], adapters: Sequence[bool]) -> list[str]:
    """One line per (category, adapter), then the categories together per adapter."""
    lines = []
    for (category, adapter), tally in tallies.items():
        lines.append(tally.line(f"{category} {'adapter' if adapter else 'base'}"))
    for adapter in adapters:
        cells = [t for (_, a), t in tallies.items() if a == adapter]
        together = Tally(cases=sum(t.cases for t in cells), whole=sum(t.whole for t in cells),
                         required=sum(t.required for t in cells),
                         other_tool=sum(t.other_tool for t in cells),
                         times_ms=[ms for t in cells for ms in t.times_ms],
                         passes=[n for t in cells for n in t.passes],
                         plain_steps=[n for t in cells for n in t.plain_steps])
        lines.append(together.line(f"all {'adapter' if adapter else 'base'}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--bench", required=True, type=Path,
                        help="a bench run's JSON with plain's records on the categories")
    parser.add_argument("--config", required=True,
                        help="a Serve config: its sidecar settings (and adapter) are measured")
    parser.add_argument("--categories", default="simple_python,multiple",
                        help="BFCL categories, comma-separated")
    parser.add_argument("--limit", type=int, default=100, help="cases per category")
    parser.add_argument("--adapters", choices=("both", "on", "off"), default="both",
                        help="predict with the config's adapter, without it, or both")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a sidecar setting over the config's (JSON value), repeatable")
    args = parser.parse_args(argv)
    plain = plain_calls(args.bench)
    if not plain:
        print(f"no plain records with a call in {args.bench}", file=sys.stderr)
        return 2
    app_args = sidecar_args(args.config, args.set)
    has_adapter = bool(app_args["sidecar"].get("lora"))
    adapters = {"both": [True, False], "on": [True], "off": [False]}[args.adapters]
    if any(adapters) and not has_adapter:
        parser.error(f"{args.config} serves no adapter (sidecar.lora): use --adapters off")
    tallies = asyncio.run(measure(app_args, plain, plain_steps(args.bench),
                                  args.categories.split(","), args.limit, adapters))
    for line in report(tallies, adapters):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
