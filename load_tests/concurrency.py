"""Load benchmark across concurrency: plain vs ooo on one server, at 1, 4 and 16 users.

Each level runs one block per mode, the modes' order alternating from level to level; a block
keeps `users` closed-loop clients busy for `--duration` seconds (a request still running at
the end is awaited and counted). Clients draw BFCL forced calls round-robin, each client from
its own offset, so both modes ask the same questions in the same order. Reports per level and
mode: finished requests, requests/s and committed (completion) tokens/s over the block's wall
time (its duration plus the wait for the requests still running), p50 and p95 end to end,
main-model passes, drafted and accepted tokens, outcomes, errors; while it runs it samples each
deployment's replica count from Serve (when given the Ray dashboard's address), so the plot
shows replicas over time beside latency.

    python -m load_tests.concurrency --url http://127.0.0.1:8000 --users 1,4,16 \
        --duration 60 --json bench_out/concurrency.json --plot bench_out/concurrency.png

With `--conversations bfcl-multi:<category>` it replays multi-turn conversations instead: at
each level that many agents at once, each its own tenant (`--api-keys`), closed loop, in every
mode of `--modes` (plain, ngram, suffix, drafts, ooo by default), with requests per second,
p50/p95 end to end and time to first token, passes, tokens per pass and whether the outputs
are identical across modes (load_tests/agent_replay.py):

    python -m load_tests.concurrency --conversations bfcl-multi:multi_turn_base --users 1,4,16 \
        --api-keys @keys.txt --json bench_out/agents.json

Bounded: every block stops after its duration, every request after `--timeout`. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from load_tests import agent_replay
from load_tests.bench.modes import MODES as BENCH_MODES
from load_tests.bench.modes import parse_modes
from load_tests.bfcl import SUPPORTED_CATEGORIES, BfclCase, load_bfcl
from load_tests.bfcl_multi import MultiTurnStep, load_bfcl_multi
from load_tests.load_requests import request_body

MODES = ("plain", "ooo")
Case = BfclCase | MultiTurnStep
BFCL_MULTI = "bfcl-multi"  # `--categories bfcl-multi:<category>`: load_tests/bfcl_multi.py


@dataclass
class Sample:
    mode: str
    users: int
    start_s: float  # since the run began
    e2e_ms: float
    completion_tokens: int
    main_steps: int | None
    error: str | None = None
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    outcome: str | None = None  # ooo_spec.outcome: hit, miss, sidecar_late, disabled, ...


@dataclass
class Block:
    mode: str
    users: int
    duration_s: float
    samples: list[Sample] = field(default_factory=list)
    # Wall time from the block's start to its last answer: the requests still running at
    # `duration_s` are awaited, and under load they take as long as the block itself, so
    # rates over `duration_s` alone would credit a mode for work done after it.
    elapsed_s: float | None = None

    @property
    def span_s(self) -> float:
        return self.elapsed_s if self.elapsed_s is not None else self.duration_s

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if s.error is None]
        latencies = sorted(s.e2e_ms for s in ok)
        tokens = sum(s.completion_tokens for s in ok)
        steps = [s.main_steps for s in ok if s.main_steps is not None]
        outcomes: dict[str, int] = {}
        for s in ok:
            if s.outcome is not None:
                outcomes[s.outcome] = outcomes.get(s.outcome, 0) + 1
        return {
            "mode": self.mode, "users": self.users, "finished": len(ok),
            "errors": len(self.samples) - len(ok),
            "elapsed_s": self.span_s,
            "requests_per_s": len(ok) / self.span_s if self.span_s else 0.0,
            "tokens_per_s": tokens / self.span_s if self.span_s else 0.0,
            "p50_ms": statistics.median(latencies) if latencies else None,
            "p95_ms": percentile(latencies, 0.95),
            "main_steps_median": statistics.median(steps) if steps else None,
            "main_steps_total": sum(steps),
            "drafted_tokens": sum(s.drafted_tokens for s in ok),
            "accepted_tokens": sum(s.accepted_tokens for s in ok),
            "outcomes": outcomes,
        }


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def block_order(levels: Sequence[int]) -> list[tuple[int, str]]:
    """(users, mode) blocks: modes alternate their order from one level to the next, so
    neither mode always runs on a warmer server.

    >>> block_order([1, 4])
    [(1, 'plain'), (1, 'ooo'), (4, 'ooo'), (4, 'plain')]
    """
    order: list[tuple[int, str]] = []
    for index, users in enumerate(levels):
        modes = MODES if index % 2 == 0 else tuple(reversed(MODES))
        order += [(users, mode) for mode in modes]
    return order


async def _client(client: httpx.AsyncClient, url: str, cases: Sequence[Case], offset: int,
                  block: Block, until: float, t0: float, max_tokens: int,
                  timeout_s: float, history: bool, once: bool = False) -> None:
    index = offset
    while once or time.monotonic() < until:
        case = cases[index % len(cases)]
        index += 1
        body = request_body(case, block.mode, max_tokens)
        # History off by default: both modes ask the same questions, and the main replica
        # remembers every committed call (plain ones too), so ooo would be drafted the answer.
        # Past calls and past outputs (the history and suffix sources) alike.
        body["ooo_spec"]["history"] = body["ooo_spec"]["suffix"] = history
        started = time.monotonic()
        error: str | None = None
        tokens, steps, drafted, accepted, outcome = 0, None, 0, 0, None
        try:
            reply = await client.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
            if reply.status_code != 200:
                error = f"HTTP {reply.status_code}"
            else:
                data = reply.json()
                tokens = int(data["usage"]["completion_tokens"])
                report = data.get("ooo_spec", {})
                main = report.get("main", {})
                steps = main.get("steps")
                drafted = int(main.get("drafted_tokens") or 0)
                accepted = int(main.get("accepted_tokens") or 0)
                outcome = report.get("outcome")
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            error = type(exc).__name__
        block.samples.append(Sample(block.mode, block.users, started - t0,
                                    (time.monotonic() - started) * 1000, tokens, steps, error,
                                    drafted, accepted, outcome))
        if once:
            return


async def run_block(url: str, cases: Sequence[Case], users: int, mode: str,
                    duration_s: float, t0: float, max_tokens: int, timeout_s: float,
                    history: bool = False) -> Block:
    block = Block(mode, users, duration_s)
    began = time.monotonic()
    until = began + duration_s
    limits = httpx.Limits(max_connections=users + 2)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(
            _client(client, url, cases, user * max(1, len(cases) // users), block, until, t0,
                    max_tokens, timeout_s, history)
            for user in range(users)))
    block.elapsed_s = time.monotonic() - began
    return block


def dashboard_headers(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """Ray's token for its dashboard, where Ray keeps it (RAY_AUTH_TOKEN, the file named by
    RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token): Ray 2.5x turns token authentication on for
    clusters it starts, and the dashboard then answers 401 without it."""
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(env["RAY_AUTH_TOKEN_PATH"]) if env.get("RAY_AUTH_TOKEN_PATH") else (
            home / ".ray" / "auth_token")
        token = path.read_text().strip() if path.is_file() else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


async def sample_replicas(dashboard: str, t0: float, out: list[dict[str, Any]],
                          stop: asyncio.Event, every_s: float = 1.0) -> None:
    """Replica counts per deployment from Serve's REST API, every `every_s` seconds."""
    headers = dashboard_headers(os.environ, Path.home())
    async with httpx.AsyncClient(headers=headers) as client:
        while not stop.is_set():
            try:
                reply = await client.get(f"{dashboard}/api/serve/applications/", timeout=5)
                reply.raise_for_status()
                counts: dict[str, int] = {}
                for app in reply.json().get("applications", {}).values():
                    for name, dep in (app.get("deployments") or {}).items():
                        counts[name] = sum(
                            1 for r in dep.get("replicas") or [] if r.get("state") == "RUNNING")
                out.append({"t_s": time.monotonic() - t0, "replicas": counts})
            except (httpx.HTTPError, ValueError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass


async def warm_up(url: str, cases: Sequence[Case], requests: int, max_tokens: int,
                  timeout_s: float, history: bool) -> None:
    """`requests` sequential requests per mode, not counted: a fresh server's first requests
    pay one-time costs (grammar compilation, caches) that would land on the first block."""
    for mode in MODES:
        block = Block(mode, 1, 0.0)
        for i in range(requests):
            await _client_once(url, cases[-1 - i % len(cases)], block, max_tokens, timeout_s,
                               history)


async def _client_once(url: str, case: Case, block: Block, max_tokens: int,
                       timeout_s: float, history: bool) -> None:
    async with httpx.AsyncClient() as client:
        await _client(client, url, [case], 0, block, time.monotonic() + 1e-9, time.monotonic(),
                      max_tokens, timeout_s, history, once=True)


async def run(url: str, levels: Sequence[int], duration_s: float, cases: Sequence[Case],
              max_tokens: int, timeout_s: float, dashboard: str | None,
              say: Any = print, history: bool = False, warmup: int = 0) -> dict[str, Any]:
    if warmup:
        say(f"concurrency: warming up ({warmup} requests per mode)")
        await warm_up(url, cases, warmup, max_tokens, timeout_s, history)
    t0 = time.monotonic()
    replicas: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = (asyncio.create_task(sample_replicas(dashboard, t0, replicas, stop))
               if dashboard else None)
    blocks: list[Block] = []
    try:
        for users, mode in block_order(levels):
            say(f"concurrency: {users} users, {mode}, {duration_s:.0f} s")
            blocks.append(await run_block(url, cases, users, mode, duration_s, t0, max_tokens,
                                          timeout_s, history))
    finally:
        stop.set()
        if sampler is not None:
            await sampler
    return {"summaries": [b.summary() for b in blocks],
            "samples": [asdict(s) for b in blocks for s in b.samples],
            "replicas": replicas}


def format_table(summaries: Sequence[dict[str, Any]]) -> str:
    lines = ["| users | mode | finished | errors | req/s | tokens/s | p50 ms | p95 ms | "
             "main passes (median) | drafted / accepted tokens | outcomes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summaries, key=lambda s: (s["users"], MODES.index(s["mode"]))):
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items()))
        lines.append(
            f"| {s['users']} | {s['mode']} | {s['finished']} | {s['errors']} | "
            f"{s['requests_per_s']:.3f} | {s['tokens_per_s']:.1f} | {_ms(s['p50_ms'])} | "
            f"{_ms(s['p95_ms'])} | {s['main_steps_median'] if s['main_steps_median'] else '-'} | "
            f"{s['drafted_tokens']:,} / {s['accepted_tokens']:,} | {outcomes or '-'} |")
    return "\n".join(lines)


def versus_plain(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: ooo's throughput and median latency against plain's."""
    by = {(s["users"], s["mode"]): s for s in summaries}
    rows = []
    for users in sorted({s["users"] for s in summaries}):
        plain, ooo = by.get((users, "plain")), by.get((users, "ooo"))
        if plain is None or ooo is None:
            continue
        rows.append({
            "users": users,
            "throughput_ratio": _ratio(ooo["requests_per_s"], plain["requests_per_s"]),
            "tokens_ratio": _ratio(ooo["tokens_per_s"], plain["tokens_per_s"]),
            "p50_speedup": _ratio(plain["p50_ms"], ooo["p50_ms"]),
        })
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def plot(path: Path, result: dict[str, Any]) -> Path:
    """Per level: requests/s, tokens/s and p50 of each mode (top row); every request's latency
    over the run (middle); replica counts over the run, when they were sampled (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_replicas = bool(result["replicas"])
    fig = plt.figure(figsize=(11, 9 if with_replicas else 7.5))
    grid = fig.add_gridspec(3 if with_replicas else 2, 3,
                            height_ratios=[2, 3, 1.4] if with_replicas else [2, 3])
    _plot_levels([fig.add_subplot(grid[0, i]) for i in range(3)], result["summaries"])
    lat = fig.add_subplot(grid[1, :])
    for mode, marker in zip(MODES, ("o", "^"), strict=True):
        points = [s for s in result["samples"] if s["mode"] == mode and s["error"] is None]
        lat.scatter([p["start_s"] for p in points], [p["e2e_ms"] for p in points], s=10,
                    marker=marker, label=mode, alpha=0.7)
    for s in result["summaries"]:
        first = min((p["start_s"] for p in result["samples"]
                     if p["mode"] == s["mode"] and p["users"] == s["users"]), default=None)
        if first is not None:
            lat.annotate(f"{s['users']}u {s['mode']}", (first, 0), xytext=(0, 4),
                         xycoords=("data", "axes fraction"), textcoords="offset points",
                         fontsize=7)
    lat.set_ylabel("end-to-end latency (ms)")
    lat.set_xlabel("time since start (s)")
    lat.set_yscale("log")
    lat.grid(alpha=0.3)
    lat.legend()
    if with_replicas:
        reps = fig.add_subplot(grid[2, :], sharex=lat)
        names = sorted({n for r in result["replicas"] for n in r["replicas"]})
        for name in names:
            reps.step([r["t_s"] for r in result["replicas"]],
                      [r["replicas"].get(name, 0) for r in result["replicas"]], where="post",
                      label=name)
        reps.set_ylabel("replicas")
        reps.set_xlabel("time since start (s)")
        reps.grid(alpha=0.3)
        reps.legend(fontsize=7, ncol=min(len(names), 5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_levels(axes: Sequence[Any], summaries: Sequence[dict[str, Any]]) -> None:
    levels = sorted({s["users"] for s in summaries})
    by = {(s["users"], s["mode"]): s for s in summaries}
    width = 0.38
    for ax, key, label in zip(axes, ("requests_per_s", "tokens_per_s", "p50_ms"),
                              ("requests/s", "completion tokens/s", "p50 latency (ms)"),
                              strict=True):
        for offset, mode in zip((-width / 2, width / 2), MODES, strict=True):
            ax.bar([i + offset for i in range(len(levels))],
                   [(by.get((u, mode)) or {}).get(key) or 0 for u in levels], width,
                   label=mode)
        ax.set_xticks(range(len(levels)), [f"{u} users" for u in levels])
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)


def build_parser() -> argparse.ArgumentParser:
    """The CLI; its help lists the modes (`MODES`), the categories (`SUPPORTED_CATEGORIES`)
    and every default from the parser itself."""
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.concurrency",
        description=__doc__.split("\n\n")[0] + f" Modes, each level: {', '.join(MODES)}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    parser.add_argument("--users", default="1,4,16", help="concurrency levels, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per block")
    parser.add_argument("--categories", default="simple_python,multiple",
                        help="BFCL categories, comma-separated, among: "
                        + ", ".join(SUPPORTED_CATEGORIES))
    parser.add_argument("--limit", type=int, default=100, help="cases per category")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="per-request timeout in seconds")
    parser.add_argument("--dashboard", default=None,
                        help="Ray dashboard URL, to sample replica counts (e.g. "
                        "http://127.0.0.1:8265)")
    parser.add_argument("--history", action="store_true",
                        help="let the main replica draft from past calls (off: both modes ask "
                        "the same questions, so ooo would be drafted plain's answers)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="uncounted sequential requests per mode before the first block")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="draw the plot (PNG) here")
    agents = parser.add_argument_group(
        "several agents at once (multi-turn replay)",
        "With --conversations, each level's users are agents replaying multi-turn "
        "conversations step by step, closed loop, one block per mode; --duration, "
        "--categories, --limit, --history, --warmup and --plot do not apply.")
    agents.add_argument("--conversations", default=None, metavar="bfcl-multi:CATEGORY",
                        help="replay these multi-turn conversations, e.g. "
                        "bfcl-multi:multi_turn_base")
    agents.add_argument("--modes", default=agent_replay.DEFAULT_MODES,
                        help="modes, comma-separated, among the bench's: "
                        + ", ".join(BENCH_MODES))
    agents.add_argument("--conversation-count", type=int, default=16,
                        help="conversations replayed at every level, dealt round-robin to "
                        "the agents (at least the largest level)")
    agents.add_argument("--steps", type=int, default=None,
                        help="at most this many steps of each conversation (none: all)")
    agents.add_argument("--api-keys", default=None,
                        help="one API key per agent (each agent its own tenant), "
                        "comma-separated or @FILE with one per line; the server must accept "
                        "them (`auth.api_keys`). Without: every agent is the anonymous "
                        "tenant, each mode still with its own suffix memory")
    agents.add_argument("--warmup-key", default=None,
                        help="an API key of a tenant apart from the agents': each mode first "
                        "answers one step of the conversation after the replayed ones under "
                        "it, uncounted (else the first mode on a fresh server pays the "
                        "server's warm-up)")
    return parser


def api_keys(spec: str | None, agents: int) -> list[str | None]:
    """One key per agent from `--api-keys` (a comma list or `@file`), or [None] without.

    >>> api_keys("a,b", 2), api_keys(None, 16)
    (['a', 'b'], [None])
    """
    if spec is None:
        return [None]
    text = Path(spec[1:]).read_text() if spec.startswith("@") else spec.replace(",", "\n")
    keys = [k.strip() for k in text.splitlines() if k.strip()]
    if len(keys) < agents:
        raise ValueError(f"{len(keys)} API keys for {agents} agents: one tenant per agent")
    return list(keys)


def main_agents(args: argparse.Namespace, levels: Sequence[int]) -> int:
    """`--conversations`: the multi-turn replay (load_tests/agent_replay.py)."""
    source, _, category = args.conversations.rpartition(":")
    if source != BFCL_MULTI:
        raise SystemExit(f"--conversations takes {BFCL_MULTI}:<category>, not "
                         f"{args.conversations!r}")
    modes = parse_modes(args.modes)
    unfit = [m.name for m in modes if not m.applies_to(BFCL_MULTI)]  # as the bench's sources
    if unfit:
        raise SystemExit(f"mode(s) {', '.join(unfit)} do not run on {BFCL_MULTI}")
    keys = api_keys(args.api_keys, max(levels))
    # One conversation more to warm up on, outside the replayed ones.
    steps = load_bfcl_multi(category, args.conversation_count + (args.warmup_key is not None))
    result = asyncio.run(agent_replay.run(
        args.url, levels, modes, steps, args.conversation_count, args.steps, keys,
        args.max_tokens, args.timeout, warmup_key=args.warmup_key))
    order = [m.name for m in modes]
    summaries = sorted(result["summaries"], key=lambda s: (s["agents"], order.index(s["mode"])))
    diffs = {(d["agents"], d["mode"]): d["differ"] for d in result["differences"]}
    print(agent_replay.format_table(summaries, diffs))
    print("outputs identical across modes" if not any(diffs.values())
          else f"outputs differ in {sum(diffs.values())} answers")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def load_categories(spec: str, limit: int) -> list[Case]:
    """BFCL categories, comma-separated (first `limit` cases each); a `bfcl-multi:<category>`
    item replays BFCL's multi-turn conversations call by call (first `limit` conversations;
    they need the model's full context, configs/bench.yaml)."""
    cases: list[Case] = []
    for item in (c.strip() for c in spec.split(",") if c.strip()):
        source, _, category = item.rpartition(":")
        if source == BFCL_MULTI:
            cases += load_bfcl_multi(category, limit)
        else:
            cases += load_bfcl(item, limit)
    return cases


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    levels = [int(u) for u in args.users.split(",") if u.strip()]
    if args.conversations:
        return main_agents(args, levels)
    cases = load_categories(args.categories, args.limit)
    result = asyncio.run(run(args.url, levels, args.duration, cases, args.max_tokens,
                             args.timeout, args.dashboard, history=args.history,
                             warmup=args.warmup))
    print(format_table(result["summaries"]))
    for row in versus_plain(result["summaries"]):
        print(f"{row['users']:>3} users: ooo/plain throughput {row['throughput_ratio'] or 0:.2f}x"
              f", tokens/s {row['tokens_ratio'] or 0:.2f}x, median latency "
              f"{row['p50_speedup'] or 0:.2f}x lower")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.dashboard and not result["replicas"]:
        print(f"no replica counts from {args.dashboard} (is it Ray's dashboard, and is its "
              "token in RAY_AUTH_TOKEN or ~/.ray/auth_token?)")
    if args.plot:
        plot(args.plot, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
