"""The command behind `main`: flags checked, the server started or found, the run measured with a
progress bar, the summary printed and the records written (JSON, latency plot)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from load_tests.bench.datasets import AGENT_SOURCES, Case, load_cases, parse_dataset_spec
from load_tests.bench.modes import BASELINE, PEERS, SUFFIX, Mode, parse_modes
from load_tests.bench.records import Record, RequestSettings
from load_tests.bench.run import RunLimits, build_plan, run_bench
from load_tests.bench.summary import records_as_dicts, summarize_by_source

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreachable server): printed as one line."""


def _git_commit() -> str | None:
    import subprocess
    from pathlib import Path

    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id the server lists under /v1/models."""
    import httpx

    try:
        reply = httpx.get(f"{base_url}/v1/models", timeout=timeout_s)
        reply.raise_for_status()
        return str(reply.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(
            f"cannot list models at {base_url}/v1/models ({type(exc).__name__}: {exc}); "
            "is the server running? (or use --start)"
        ) from None


def suffix_refusal(modes: Sequence[Mode], starts_server: bool) -> str | None:
    """Why the `suffix` mode cannot run, when the bench starts the server here and vLLM's
    suffix decoding cannot start (arctic-inference missing); None when it can. A server the
    bench only talks to answers for itself (a 400 `baseline_not_deployed`, which stops the
    run in warm-up)."""
    from app.engine.vllm_suffix import SUFFIX_MISSING, suffix_available

    if not starts_server or SUFFIX not in {m.name for m in modes} or suffix_available():
        return None
    return f"mode {SUFFIX} refused: {SUFFIX_MISSING}; or leave {SUFFIX} out of --modes"


def run_command(args: Any, say: Callable[[str], None]) -> int:
    """The run behind `main`: see `build_parser` for the flags."""
    from datetime import datetime
    from pathlib import Path

    from load_tests import report

    try:
        modes = parse_modes(args.modes)
        specs = parse_dataset_spec(args.dataset)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if args.limit is not None and args.limit < 1:
        raise BenchError("--limit must be at least 1")
    if args.conversations is not None and args.conversations < 1:
        raise BenchError("--conversations must be at least 1")
    if args.warmup < 0:
        raise BenchError("--warmup must not be negative")
    # BFCL now (a bad category fails before any server starts); the agent set needs the
    # server's tool listing, so it loads once the server answers.
    cases: list[Case] = load_cases([s for s in specs if s.source not in AGENT_SOURCES],
                                   args.limit, conversations=args.conversations)
    wants_agent = any(s.source in AGENT_SOURCES for s in specs)
    if not cases and not wants_agent:
        raise BenchError(f"dataset {args.dataset} has no cases")
    unused = [m.name for m in modes
              if not any(m.applies_to(s.source) for s in specs)]
    if unused:
        raise BenchError(f"mode(s) {', '.join(unused)} run on none of these datasets "
                         f"(e.g. ooo+tools needs server-known tools: add the 'agent' set)")
    refusal = suffix_refusal(modes, bool(args.start))
    if refusal:
        raise BenchError(refusal)
    say(f"ooo-spec bench: datasets {', '.join(map(str, specs))}; "
        f"modes {', '.join(m.name for m in modes)}; warm-up {args.warmup} per mode and source")

    started_server = False
    try:
        if args.start:
            from deployments import local

            if args.slow_tool_ms is not None:
                from load_tests.bench_tools import SLOW_TOOL_ENV

                # Ray's workers (the tool worker among them) inherit the driver's environment.
                os.environ[SLOW_TOOL_ENV] = str(args.slow_tool_ms)
            config = local.load_serve_config(args.config)
            # Each mode's own suffix index (`suffix_scope`) is a diagnostics switch the
            # server allows only when told to: the app the bench starts is told.
            for application in config.get("applications") or []:
                app_args = application.setdefault("args", {}) or {}
                app_args.setdefault("diagnostics", {})["suffix_scopes"] = True
                application["args"] = app_args
            if args.port is not None:
                config.setdefault("http_options", {})["port"] = args.port
            say(f"ooo-spec bench: starting the app from {args.config} "
                f"on port {(config.get('http_options') or {}).get('port', 8000)} ...")
            t0 = time.monotonic()
            started_server = True
            base_url = local.start(config)
            say(f"ooo-spec bench: app ready in {time.monotonic() - t0:.0f} s at {base_url}")
        else:
            base_url = args.base_url or (
                f"http://127.0.0.1:{args.port}" if args.port is not None else DEFAULT_BASE_URL
            )
        base_url = base_url.rstrip("/")
        if base_url.endswith("/v1"):
            base_url = base_url[: -len("/v1")]
        model = args.model or served_model(base_url)
        if wants_agent:
            try:
                cases += load_cases([s for s in specs if s.source in AGENT_SOURCES], args.limit,
                                    server_tools=lambda: server_tool_listing(base_url))
            except ValueError as exc:
                raise BenchError(str(exc)) from None
        say(f"ooo-spec bench: {len(cases)} cases")
        records, stop_reason, elapsed = _measure(args, cases, modes, base_url, model)
    finally:
        if started_server:
            say("ooo-spec bench: stopping the app")
            from deployments import local

            local.stop()

    names = [m.name for m in modes]
    summaries = summarize_by_source(records, modes)
    print(format_header(args, base_url, model, len(cases), elapsed, stop_reason))
    for source, summary in summaries.items():
        if len(summaries) > 1:
            print(f"\n=== {source} ===\n")
        print(report.format_summary(summary, BASELINE, PEERS))
        if "multi_turn" in summary:
            print(report.format_multi_turn(summary["multi_turn"], BASELINE, PEERS))

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out)
    record_dicts = records_as_dicts(records)
    payload: dict[str, Any] = {
        "meta": {
            "dataset": args.dataset,
            "categories": [str(s) for s in specs],
            "limit": args.limit,
            "conversations": args.conversations,
            "modes": {m.name: dict(m.extra_body) for m in modes},
            "warmup": args.warmup,
            "base_url": base_url,
            "model": model,
            "started_server": bool(args.start),
            "config": args.config if args.start else None,
            "request": {"max_tokens": args.max_tokens, "temperature": 0.0,
                        "tool_choice": "required (auto on the bfcl-auto and agent-auto sets)",
                        "timeout_s": args.timeout,
                        "agent": "tool_choice and max_tokens per scenario, execute_tools"},
            "slow_tool_ms": args.slow_tool_ms if args.start else None,
            "cases": len(cases),
            "elapsed_s": elapsed,
            "stop_reason": stop_reason,
            "git_commit": _git_commit(),
            "finished_at": datetime.now().isoformat(timespec="seconds"),
        },
        "summary": summaries,  # per dataset source
        "records": record_dicts,
    }
    json_path = report.write_json(out_dir / f"bench-{stamp}.json", payload)
    print(f"\nrecords + summary: {json_path}")
    for source in summaries:
        suffix = f"-{source}" if len(summaries) > 1 else ""
        png_path = report.plot_latencies(
            out_dir / f"bench-{stamp}{suffix}.png",
            [r for r in record_dicts if r["source"] == source], names,
            title=f"{source}: {args.dataset} on {model}",
        )
        if png_path is not None:
            print(f"latency plot:      {png_path}")
    if stop_reason is not None:
        say(f"ooo-spec bench: stopped early: {stop_reason}")
        return 1
    return 0 if any(r.ok and not r.warmup for r in records) else 1


def format_header(
    args: Any, base_url: str, model: str, cases: int, elapsed: float, stop: str | None
) -> str:
    line = (f"\nooo-spec bench  dataset={args.dataset} cases={cases} warmup={args.warmup}/mode "
            f"server={base_url} model={model} elapsed={elapsed:.0f}s")
    if stop:
        line += f"  STOPPED EARLY: {stop}"
    return line + "\n"


def server_tool_listing(base_url: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The `data` of `GET /v1/tools`."""
    import httpx

    try:
        reply = httpx.get(f"{base_url}/v1/tools", timeout=timeout_s)
        reply.raise_for_status()
        return list(reply.json()["data"])
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise BenchError(
            f"cannot list the server's tools at {base_url}/v1/tools ({type(exc).__name__}: "
            f"{exc}); the agent set needs them"
        ) from None


def _measure(
    args: Any, cases: Sequence[Case], modes: Sequence[Mode], base_url: str, model: str
) -> tuple[list[Record], str | None, float]:
    from openai import OpenAI
    from tqdm import tqdm

    client = OpenAI(base_url=f"{base_url}/v1", api_key="ooo-spec-bench", max_retries=0,
                    timeout=args.timeout)
    total = len(build_plan(cases, modes, args.warmup))
    bar = tqdm(total=total, file=sys.stderr, unit="req", dynamic_ncols=True,
               disable=args.no_progress)
    failures = Counter[str]()
    outcomes = Counter[str]()

    def progress(record: Record) -> None:
        if record.error:
            failures[record.mode] += 1
        elif not record.warmup and record.mode != BASELINE:
            outcomes[record.outcome or "?"] += 1
        postfix: dict[str, Any] = {"case": record.case_id, "mode": record.mode,
                   "ms": f"{record.e2e_ms:.0f}"}
        if outcomes:
            postfix["outcomes"] = " ".join(f"{k}:{v}" for k, v in outcomes.most_common())
        if failures:
            postfix["errors"] = sum(failures.values())
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)

    t0 = time.monotonic()
    try:
        records, stop_reason = run_bench(
            client, cases, modes, RequestSettings(model=model, max_tokens=args.max_tokens),
            warmup=args.warmup,
            limits=RunLimits(request_timeout_s=args.timeout, max_duration_s=args.max_duration,
                             max_consecutive_errors=args.max_errors),
            progress=progress,
        )
    finally:
        bar.close()
        client.close()
    return records, stop_reason, time.monotonic() - t0
