"""Bounded soak: concurrent clients send a mix of good and bad requests for a fixed time while
the RSS of the router and engine replica processes is sampled.

    .venv/bin/python -m load_tests.soak --start --port 8125            # `make soak`
    .venv/bin/python -m load_tests.soak --base-url http://127.0.0.1:8000 --duration 60

Good requests (tool calls with and without speculation, streaming, plain text, server tools
with `execute_tools`, and streams the client abandons after the first chunk) must get a 200
whose body is a whole completion; bad requests (broken JSON, limits, bad schemas, unknown model
or route, an oversized body, a conversation longer than the context) must get exactly their
4xx. The run fails (exit 1) on a good request that is not answered 200 (a 5xx above all) or not
answered at all within the timeout, on a bad request not answered with its 4xx, on a replica
process whose RSS grows more than `--rss-growth-mib` above its RSS at the end of the warm-up,
and (with `--start`) on engine requests still open after the run.

RSS sampling needs the replica processes: with `--start` they are this process's descendants
(Ray runs under it); with `--base-url` the machine's `ray::ServeReplica:<app>:<name>`
processes are used when each name matches exactly one process, else memory is not checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

APP = "ooo-spec"
DEPLOYMENTS = ("Router", "MainModel", "Sidecar", "ToolWorker")
REQUEST_TIMEOUT_S = 180.0
MIB = 1 << 20

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}}
CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}},
    "required": ["expression"]}}}
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Hanoi")


# ----- requests -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """One request to send: what it is, how it must be answered."""

    kind: str
    good: bool
    expect: int  # the status a correct server answers
    path: str = "/v1/chat/completions"
    method: str = "POST"
    body: bytes = b""
    stream: bool = False
    abandon: bool = False  # a stream the client drops after its first chunk


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()


def _weather(rng: random.Random, **extra: Any) -> dict[str, Any]:
    city = rng.choice(CITIES)
    return {"messages": [{"role": "user", "content": f"What is the weather in {city}?"}],
            "tools": [TOOL], "tool_choice": "required", "temperature": 0, "max_tokens": 48,
            **extra}


def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def good_probes(rng: random.Random) -> list[Probe]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return [
        Probe("tool_ooo", True, 200, body=_json(_weather(rng, ooo_spec={"enabled": True}))),
        Probe("tool_plain", True, 200, body=_json(_weather(rng, ooo_spec={"enabled": False}))),
        Probe("tool_stream", True, 200, stream=True,
              body=_json(_weather(rng, stream=True, stream_options={"include_usage": True}))),
        Probe("text", True, 200, body=_json({
            "messages": [{"role": "user", "content": f"Say hello to {rng.choice(CITIES)}."}],
            "temperature": 0.7, "seed": rng.randint(0, 1000), "max_tokens": 24})),
        Probe("execute_tools", True, 200, body=_json({
            "messages": [{"role": "user", "content": f"What is {a}*{b}?"}],
            "tools": [CALCULATOR],
            "tool_choice": {"type": "function", "function": {"name": "calculator"}},
            "temperature": 0, "max_tokens": 48,
            "ooo_spec": {"enabled": True, "execute_tools": True, "max_steps": 1,
                         "server_tools": True}})),
        Probe("abandoned_stream", True, 200, stream=True, abandon=True, body=_json({
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "tools": [TOOL], "tool_choice": "auto", "max_tokens": 200, "stream": True})),
    ]


def bad_probes(rng: random.Random, max_body_bytes: int = 1_000_000) -> list[Probe]:
    base = _weather(rng)
    return [
        Probe("invalid_json", False, 400, body=b'{"messages": [{"role": "user", "cont'),
        Probe("not_an_object", False, 400, body=b"[1, 2, 3]"),
        Probe("n_too_many", False, 400, body=_json({**base, "n": 99})),
        Probe("unknown_model", False, 404, body=_json({**base, "model": "gpt-17"})),
        Probe("bad_schema", False, 400, body=_json({**base, "tools": [
            {"type": "function", "function": {"name": "broken",
                                              "parameters": {"type": "objekt"}}}]})),
        Probe("too_many_tools", False, 400, body=_json({**base, "tool_choice": "auto", "tools": [
            {"type": "function", "function": {"name": f"t{i}", "parameters": TOOL["function"][
                "parameters"]}} for i in range(200)]})),
        Probe("schema_too_deep", False, 400, body=_json({**base, "tools": [
            {"type": "function", "function": {"name": "deep", "parameters": _deep_schema(30)}}],
            "tool_choice": "auto"})),
        Probe("max_tokens_too_large", False, 400, body=_json({**base, "max_tokens": 10**6})),
        Probe("deep_json", False, 400, body=b"[" * 50_000),
        Probe("body_too_large", False, 413, body=_json(
            {**base, "messages": [{"role": "user", "content": "x" * (max_body_bytes + 1)}]})),
        Probe("context_too_long", False, 400, body=_json(
            {"messages": [{"role": "user", "content": "word " * 4000}], "max_tokens": 8})),
        Probe("stream_context_too_long", False, 400, stream=True, body=_json(
            {"messages": [{"role": "user", "content": "word " * 4000}], "max_tokens": 8,
             "stream": True})),
        Probe("unknown_route", False, 404, path="/v1/nothing-here", method="GET"),
        Probe("wrong_method", False, 405, path="/v1/chat/completions", method="GET"),
    ]


def pick(rng: random.Random, bad_fraction: float) -> Probe:
    if rng.random() < bad_fraction:
        return rng.choice(bad_probes(rng))
    return rng.choice(good_probes(rng))


# ----- verdicts (pure) -------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str
    good: bool
    status: int  # 0: no answer (timeout, connection error)
    latency_ms: float
    problem: str | None = None


def judge(probe: Probe, status: int, text: str) -> str | None:
    """None when the answer is right for the probe, else what is wrong with it."""
    if status == 0:
        return f"no answer: {text[:200]}"
    if not probe.good:
        if status != probe.expect:
            return f"bad request answered {status}, expected {probe.expect}: {text[:200]}"
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{status} without the OpenAI error envelope: {text[:200]}"
        return None if error.get("message") else "error without a message"
    if status != 200:
        return f"good request answered {status}: {text[:200]}"
    if probe.abandon:
        return None
    if probe.stream:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return "stream did not end with [DONE]"
        for event in events[:-1]:
            if '"error"' in event and "error" in json.loads(event):
                return f"in-band error: {event[:200]}"
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:200]}"
    if body.get("object") != "chat.completion" or "ooo_spec" not in body:
        return f"not a chat.completion with ooo_spec: {text[:200]}"
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


@dataclass
class RssSeries:
    """RSS samples (t seconds from the start, bytes) of one process."""

    name: str
    pid: int
    samples: list[tuple[float, int]] = field(default_factory=list)

    def summary(self, warmup_s: float) -> dict[str, Any]:
        if not self.samples:
            return {"name": self.name, "pid": self.pid, "samples": 0}
        after = [rss for t, rss in self.samples if t >= warmup_s] or [self.samples[-1][1]]
        warm = [rss for t, rss in self.samples if t <= warmup_s]
        baseline = warm[-1] if warm else after[0]
        return {
            "name": self.name, "pid": self.pid, "samples": len(self.samples),
            "start_mib": self.samples[0][1] / MIB,
            "baseline_mib": baseline / MIB,
            "end_mib": self.samples[-1][1] / MIB,
            "max_mib": max(rss for _, rss in self.samples) / MIB,
            "growth_mib": (max(after) - baseline) / MIB,
        }


def rss_problems(summaries: Sequence[dict[str, Any]], bound_mib: float) -> list[str]:
    return [f"{s['name']} (pid {s['pid']}) grew {s['growth_mib']:.0f} MiB after the warm-up; "
            f"the bound is {bound_mib:.0f} MiB"
            for s in summaries if s.get("samples") and s["growth_mib"] > bound_mib]


def summarize(outcomes: Sequence[Outcome], elapsed_s: float) -> dict[str, Any]:
    good = [o for o in outcomes if o.good]
    bad = [o for o in outcomes if not o.good]
    return {
        "requests": len(outcomes),
        "elapsed_s": elapsed_s,
        "good": len(good),
        "bad": len(bad),
        "good_5xx": sum(1 for o in good if o.status >= 500),
        "good_failed": sum(1 for o in good if o.problem),
        "bad_4xx": sum(1 for o in bad if 400 <= o.status < 500),
        "bad_failed": sum(1 for o in bad if o.problem),
        "all_4xx": sum(1 for o in outcomes if 400 <= o.status < 500),
        "all_5xx": sum(1 for o in outcomes if o.status >= 500),
        "no_answer": sum(1 for o in outcomes if o.status == 0),
        "statuses": dict(sorted(Counter(o.status for o in outcomes).items())),
        "kinds": dict(sorted(Counter(o.kind for o in outcomes).items())),
        "good_p50_ms": percentile([o.latency_ms for o in good], 0.50),
        "good_p99_ms": percentile([o.latency_ms for o in good], 0.99),
        "bad_p50_ms": percentile([o.latency_ms for o in bad], 0.50),
        "bad_p99_ms": percentile([o.latency_ms for o in bad], 0.99),
        "problems": Counter(f"{o.kind}: {o.problem[:120]}" for o in outcomes
                            if o.problem).most_common(10),
    }


# ----- the run (I/O) --------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, base_url: str, probe: Probe) -> Outcome:
    started = time.perf_counter()
    url = f"{base_url}{probe.path}"
    headers = {"content-type": "application/json"}
    try:
        async with client.stream(probe.method, url, content=probe.body or None,
                                 headers=headers) as response:
            if probe.abandon and response.status_code == 200:
                async for _ in response.aiter_bytes():
                    break  # leave with the first chunk: the server must abort the generation
                text = ""
            else:
                text = (await response.aread()).decode(errors="replace")
            status = response.status_code
    except httpx.HTTPError as exc:
        status, text = 0, f"{type(exc).__name__}: {exc}"
    latency = (time.perf_counter() - started) * 1000
    return Outcome(probe.kind, probe.good, status, latency, judge(probe, status, text))


async def client_loop(index: int, base_url: str, deadline: float, bad_fraction: float,
                      seed: int, outcomes: list[Outcome]) -> None:
    rng = random.Random(seed * 1000 + index)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30)
    async with httpx.AsyncClient(timeout=timeout) as client:
        while time.monotonic() < deadline:
            outcomes.append(await send(client, base_url, pick(rng, bad_fraction)))


def replica_processes(root_pid: int | None) -> dict[str, int]:
    """`ray::ServeReplica:<app>:<deployment>` processes by deployment name: among the
    descendants of `root_pid`, or machine-wide when None (then only unique matches)."""
    import psutil

    if root_pid is not None:
        candidates = psutil.Process(root_pid).children(recursive=True)
    else:
        candidates = list(psutil.process_iter())
    found: dict[str, list[int]] = {}
    for proc in candidates:
        try:
            title = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for name in DEPLOYMENTS:
            if f"ServeReplica:{APP}:{name}" in title and f"{name}Ngram" not in title:
                found.setdefault(name, []).append(proc.pid)
    return {name: pids[0] for name, pids in found.items() if len(pids) == 1}


async def sample_rss(series: list[RssSeries], started: float, stop: asyncio.Event,
                     every_s: float) -> None:
    import psutil

    while True:
        now = time.monotonic() - started
        for s in series:
            try:
                s.samples.append((now, psutil.Process(s.pid).memory_info().rss))
            except psutil.NoSuchProcess:
                pass  # a replaced replica: its series just ends
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            continue


async def soak(base_url: str, clients: int, duration_s: float, bad_fraction: float, seed: int,
               series: list[RssSeries], sample_every_s: float,
               say: Callable[[str], None]) -> tuple[list[Outcome], float]:
    outcomes: list[Outcome] = []
    started = time.monotonic()
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(sample_rss(series, started, stop, sample_every_s))

    async def progress() -> None:
        while True:
            await asyncio.sleep(30)
            failed = sum(1 for o in outcomes if o.problem)
            say(f"soak: {time.monotonic() - started:.0f} s, {len(outcomes)} requests, "
                f"{failed} failed")

    reporter = asyncio.ensure_future(progress())
    deadline = started + duration_s
    await asyncio.gather(*(client_loop(i, base_url, deadline, bad_fraction, seed, outcomes)
                           for i in range(clients)))
    elapsed = time.monotonic() - started
    reporter.cancel()
    await asyncio.sleep(2)  # one more RSS sample once abandoned requests have been cleaned up
    stop.set()
    await sampler
    return outcomes, elapsed


def engine_leaks(timeout_s: float = 30) -> list[str]:
    """With --start: MainModel and Sidecar must hold no request once the clients are gone."""
    from ray import serve

    problems: list[str] = []
    for name in ("MainModel", "Sidecar"):
        handle = serve.get_deployment_handle(name, app_name=APP)
        deadline = time.monotonic() + timeout_s
        counters: dict[str, int] = {}
        while time.monotonic() < deadline:
            counters = handle.engine_counters.remote().result(timeout_s=30)
            if counters["unfinished"] == 0 and counters["streams"] == 0 and counters[
                    "store"] == 0:
                break
            time.sleep(1)
        else:
            problems.append(f"{name} still holds engine requests after the run: {counters}")
    return problems


def print_summary(summary: dict[str, Any], rss: list[dict[str, Any]], bound_mib: float,
                  warmup_s: float, say: Callable[[str], None]) -> None:
    say(f"soak: {summary['requests']} requests in {summary['elapsed_s']:.0f} s "
        f"({summary['good']} good, {summary['bad']} bad); statuses {summary['statuses']}")
    say(f"  5xx: {summary['all_5xx']} (on good requests: {summary['good_5xx']}); "
        f"4xx: {summary['all_4xx']} (bad requests answered 4xx: {summary['bad_4xx']}"
        f"/{summary['bad']}); no answer: {summary['no_answer']}")
    say(f"  good requests failed: {summary['good_failed']}; bad requests answered wrongly: "
        f"{summary['bad_failed']}")
    say(f"  latency good p50 {summary['good_p50_ms']:.0f} ms, p99 {summary['good_p99_ms']:.0f} "
        f"ms; bad p50 {summary['bad_p50_ms']:.0f} ms, p99 {summary['bad_p99_ms']:.0f} ms")
    say(f"  RSS (MiB; bound: growth after the {warmup_s:.0f} s warm-up <= {bound_mib:.0f}):")
    for s in rss:
        if not s.get("samples"):
            say(f"    {s['name']:<10} pid {s['pid']}: no samples")
            continue
        say(f"    {s['name']:<10} pid {s['pid']:<7} start {s['start_mib']:7.0f}  "
            f"after warm-up {s['baseline_mib']:7.0f}  end {s['end_mib']:7.0f}  "
            f"max {s['max_mib']:7.0f}  growth {s['growth_mib']:+6.0f}")
    for problem, count in summary["problems"]:
        say(f"  problem x{count}: {problem}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults from the parser itself; the description as laid out."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m load_tests.soak", description=__doc__,
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--duration", type=float, default=300, help="seconds")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--bad-fraction", type=float, default=0.3,
                        help="share of bad requests")
    parser.add_argument("--base-url", default=None, help="server to soak (None: --port)")
    parser.add_argument("--port", type=int, default=8000, help="port")
    parser.add_argument("--start", action="store_true",
                        help="start the app from --config on --port first, stop it at the end")
    parser.add_argument("--config", default="configs/local.yaml",
                        help="Serve config for --start")
    parser.add_argument("--rss-growth-mib", type=float, default=256,
                        help="allowed RSS growth per process after the warm-up")
    parser.add_argument("--warmup", type=float, default=60,
                        help="seconds before the RSS baseline is taken")
    parser.add_argument("--sample-every", type=float, default=5.0, help="RSS period, seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    parser.add_argument("--json", default=None, help="also write the summary here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    base_url = args.base_url or f"http://127.0.0.1:{args.port}"
    started_app = False
    try:
        if args.start:
            from deployments import local

            config = local.load_serve_config(args.config)
            config["http_options"] = {**config.get("http_options", {}), "port": args.port}
            say(f"soak: starting {args.config} on port {args.port} ...")
            base_url = local.start(config)
            started_app = True
        pids = replica_processes(os.getpid() if args.start else None)
        missing = [name for name in DEPLOYMENTS if name not in pids]
        if missing:
            say(f"soak: no unique replica process for {missing}: their memory is not checked")
        series = [RssSeries(name, pid) for name, pid in sorted(pids.items())]
        say(f"soak: {args.clients} clients for {args.duration:.0f} s against {base_url}")
        outcomes, elapsed = asyncio.run(soak(
            base_url, args.clients, args.duration, args.bad_fraction, args.seed, series,
            args.sample_every, say))
        summary = summarize(outcomes, elapsed)
        rss = [s.summary(args.warmup) for s in series]
        problems = rss_problems(rss, args.rss_growth_mib)
        if started_app:
            problems.extend(engine_leaks())
        print_summary(summary, rss, args.rss_growth_mib, args.warmup, say)
        failed = summary["good_failed"] + summary["bad_failed"]
        if failed:
            problems.append(f"{failed} requests were not answered as they must be")
        if not outcomes:
            problems.append("no request was sent")
        for problem in problems:
            say(f"soak: FAIL: {problem}")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(
                {"summary": summary, "rss": rss, "problems": problems,
                 "settings": vars(args),
                 # The raw samples, to tell a plateau (caches, allocator) from a leak.
                 "rss_samples_mib": {s.name: [(round(t, 1), round(v / MIB, 1))
                                              for t, v in s.samples] for s in series}},
                indent=2))
        say("soak: " + ("FAILED" if problems else "passed"))
        return 1 if problems else 0
    finally:
        if started_app:
            from deployments import local

            local.stop()


if __name__ == "__main__":
    sys.exit(main())
