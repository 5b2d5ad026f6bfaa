"""How often the sidecar's tool choice names plain's tool, per `sidecar.choice_prompt`.

One sidecar engine in this process (the sidecar of `--config`, without an adapter: the base
model chooses), the first `--limit` cases of BFCL `multiple`, and the tool plain committed for
each, read from a bench run's records (`load_tests.bench ... --modes plain,...`):

    python -m load_tests.choice_prompts --bench bench_out/run/bench-*.json --limit 100

Prints per setting: the choices that differ from plain's, the median tokens before the name,
and the median time of the choice alone (one request at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, get_args


def plain_tools(bench_file: Path) -> dict[str, str]:
    """Case id -> the tool plain committed first, from a bench run's records."""
    from load_tests.sidecar_agreement import plain_calls

    return {case_id: calls[0].name for case_id, calls in plain_calls(bench_file).items()}


async def measure(config_file: str, plain: dict[str, str], limit: int,
                  settings: list[str]) -> list[str]:
    import yaml

    from app.config import AppConfig
    from app.distill.collect import DistillCase, request_body
    from app.openai_models import ChatCompletionRequest
    from app.sidecar.service import SidecarService
    from load_tests.bfcl import load_bfcl

    args = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
    app_args: dict[str, Any] = args["applications"][0]["args"]
    engine = app_args["sidecar"]["engine"]
    service = SidecarService(AppConfig.model_validate({"sidecar": {"engine": engine}}))
    service.start()
    cases = [c for c in load_bfcl("multiple")[:limit] if c.id in plain]
    lines = []
    try:
        for setting in settings:
            # Only the prompts change: the engine started above stays.
            service.config = AppConfig.model_validate(
                {"sidecar": {"engine": engine, "choice_prompt": setting}})
            wrong, lengths, times = 0, [], []
            for case in cases:
                body = request_body(DistillCase(id=case.id, source="bfcl:multiple",
                                                messages=case.messages, tools=case.tools))
                request = ChatCompletionRequest.model_validate(body)
                head = service.choice_head(request, "required", service.slot_prompt(request))
                began = time.perf_counter()
                name = await service.choose(head, list(request.tool_schemas()))
                times.append((time.perf_counter() - began) * 1000)
                lengths.append(len(head))
                wrong += name != plain[case.id]
            lines.append(f"{setting:10s}  other tool than plain: {wrong} of {len(cases)}  "
                         f"tokens before the name (median): {statistics.median(lengths):.0f}  "
                         f"choice (median): {statistics.median(times):.0f} ms")
    finally:
        service.engine.stop()
    return lines


def main(argv: list[str] | None = None) -> int:
    from app.config import SidecarConfig

    choices = get_args(SidecarConfig.model_fields["choice_prompt"].annotation)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--bench", required=True, type=Path,
                        help="a bench run's JSON with plain's records on `multiple`")
    parser.add_argument("--config", default="configs/bench.yaml", help="Serve config measured")
    parser.add_argument("--limit", type=int, default=100, help="cases")
    parser.add_argument("--settings", default=",".join(choices),
                        help="sidecar.choice_prompt settings compared, comma-separated")
    args = parser.parse_args(argv)
    settings = args.settings.split(",")
    unknown = [s for s in settings if s not in choices]
    if unknown:
        parser.error(f"unknown settings {unknown}: choose from {list(choices)}")
    plain = plain_tools(args.bench)
    if not plain:
        print(f"no plain records with a call in {args.bench}", file=sys.stderr)
        return 2
    for line in asyncio.run(measure(args.config, plain, args.limit, settings)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
