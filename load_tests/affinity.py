"""Cache affinity under load (issue 31): multi-turn agents on two MainModel replicas, with
`PrefixAffinityRouter` and with Serve's own router, in one run.

Each user is a tenant (its own API key) replaying one BFCL multi-turn conversation step by step
(`load_tests/bfcl_multi.py`: the ground-truth history, real tool results), closed loop, all users
at once. For each routing mode the app is started from `--config` with the MainModel held at
two replicas and the request router on or off (nothing else differs), the users run their
conversations, and the app is stopped. Reported per mode, for first turns and for follow-up
turns: the main replica's time to first token (`ooo_spec.main.ttft_ms`: prefill, where the
prefix cache tells) and the client's end to end, medians; how many follow-ups ran on their
previous turn's replica; the share of follow-up prompt tokens the prefix cache served; and the
requests each replica served. Plain decoding (`ooo_spec.enabled: false`): routing is what is
measured, and the outputs of both modes are compared (they must be identical).

    python -m load_tests.affinity --users 4 --steps 5 --json bench_out/affinity.json

Bounded: `users` conversations of at most `--steps` requests per mode, each request within
`--timeout`. Loopback only.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from load_tests.bfcl_multi import MULTI_CATEGORIES, MultiTurnStep, load_bfcl_multi

ROUTINGS = ("affinity", "serve")  # PrefixAffinityRouter, Serve's power of two choices
# The context BFCL's multi-turn tools need (2,100-4,400 tokens of tools alone), as bench.yaml.
CONTEXT = {"max_model_len": 8192, "kv_cache_gib": 1.0}


@dataclass(frozen=True)
class Sample:
    routing: str
    user: int
    step: int  # 0: the conversation's first request
    replica: str | None
    cached_tokens: int
    prompt_tokens: int
    ttft_ms: float
    e2e_ms: float
    answer: str  # the message's tool calls and content, for the comparison of modes
    error: str | None = None


def user_conversations(steps: Sequence[MultiTurnStep], users: int, max_steps: int
                       ) -> list[list[MultiTurnStep]]:
    """One conversation per user, in BFCL's order, each cut to its first `max_steps` steps."""
    by_conversation: dict[str, list[MultiTurnStep]] = {}
    for step in steps:
        by_conversation.setdefault(step.conversation, []).append(step)
    conversations = [sorted(c, key=lambda s: s.index)[:max_steps]
                     for c in by_conversation.values()]
    if len(conversations) < users:
        raise ValueError(f"{len(conversations)} conversations for {users} users")
    return conversations[:users]


def api_keys(users: int) -> list[str]:
    return [f"affinity-load-user-{u}-0123456789" for u in range(users)]


def serve_config(base: dict[str, Any], routing: str, users: int, port: int) -> dict[str, Any]:
    """`base` with the MainModel held at two replicas, its request router `routing`, the
    bench's context on main and sidecar, and one API key (tenant) per user."""
    config = copy.deepcopy(base)
    config["http_options"] = {**config.get("http_options", {}), "port": port}
    (app,) = config["applications"]
    for part in ("main", "sidecar"):
        app["args"][part]["engine"].update(CONTEXT)
    app["args"]["auth"] = {"api_keys": [{"key": k, "name": f"user-{u}"}
                                        for u, k in enumerate(api_keys(users))]}
    [main] = [d for d in app["deployments"] if d["name"] == "MainModel"]
    main["autoscaling_config"] = {**main["autoscaling_config"],
                                  "min_replicas": 2, "max_replicas": 2}
    if routing == "serve":
        main.pop("request_router_config", None)
    elif "request_router_config" not in main:
        raise ValueError("the config sets no request_router_config on MainModel")
    return config


def wait_for_main_replicas(app: str, count: int, timeout_s: float = 600.0) -> None:
    """Until `count` MainModel replicas run: /healthz answers once one does."""
    from ray import serve
    from ray.serve._private.common import ReplicaState

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status().applications[app].deployments["MainModel"]
        if status.replica_states.get(ReplicaState.RUNNING, 0) >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"{count} MainModel replicas not running within {timeout_s:.0f} s")


def request(step: MultiTurnStep, max_tokens: int) -> dict[str, Any]:
    return {"messages": step.messages, "tools": step.tools, "tool_choice": "required",
            "temperature": 0, "max_tokens": max_tokens, "ooo_spec": {"enabled": False}}


def converse(url: str, key: str, routing: str, user: int, steps: Sequence[MultiTurnStep],
             max_tokens: int, timeout_s: float) -> list[Sample]:
    samples = []
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s) as client:
        for n, step in enumerate(steps):
            started = time.monotonic()
            try:
                reply = client.post(f"{url}/v1/chat/completions", json=request(step, max_tokens))
                e2e = (time.monotonic() - started) * 1000
                if reply.status_code != 200:
                    raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
                data = reply.json()
                [route] = data["ooo_spec"]["routing"]
                message = data["choices"][0]["message"]
                answer = json.dumps([message.get("content"), [
                    (c["function"]["name"], c["function"]["arguments"])
                    for c in message.get("tool_calls") or []]])
                samples.append(Sample(routing, user, n, route["replica"], route["cached_tokens"],
                                      route["prompt_tokens"], data["ooo_spec"]["main"]["ttft_ms"],
                                      e2e, answer))
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
                samples.append(Sample(routing, user, n, None, 0, 0, 0.0,
                                      (time.monotonic() - started) * 1000, "", repr(exc)))
    return samples


def run_users(url: str, routing: str, conversations: Sequence[Sequence[MultiTurnStep]],
              max_tokens: int, timeout_s: float) -> list[Sample]:
    keys = api_keys(len(conversations))
    with ThreadPoolExecutor(max_workers=len(conversations)) as pool:
        runs = pool.map(lambda u: converse(url, keys[u], routing, u, conversations[u],
                                           max_tokens, timeout_s), range(len(conversations)))
        return [s for run in runs for s in run]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(samples: Sequence[Sample]) -> dict[str, Any]:
    """One routing mode's numbers (see the module doc)."""
    ok = [s for s in samples if s.error is None]
    first = [s for s in ok if s.step == 0]
    later = [s for s in ok if s.step > 0]
    by_turn = {(s.user, s.step): s for s in ok}
    stayed = [s for s in later
              if (prev := by_turn.get((s.user, s.step - 1))) and prev.replica == s.replica]
    per_replica: dict[str, int] = {}
    for s in ok:
        per_replica[str(s.replica)] = per_replica.get(str(s.replica), 0) + 1
    prompt = sum(s.prompt_tokens for s in later)
    return {
        "requests": len(samples), "errors": len(samples) - len(ok),
        "first_ttft_ms_p50": _median([s.ttft_ms for s in first]),
        "first_e2e_ms_p50": _median([s.e2e_ms for s in first]),
        "follow_ups": len(later),
        "follow_up_ttft_ms_p50": _median([s.ttft_ms for s in later]),
        "follow_up_e2e_ms_p50": _median([s.e2e_ms for s in later]),
        # Means too: a follow-up sent to the wrong replica pays the whole prefill again, which
        # a median over mostly-cached turns hides.
        "follow_up_ttft_ms_mean": _mean([s.ttft_ms for s in later]),
        "follow_up_e2e_ms_mean": _mean([s.e2e_ms for s in later]),
        "follow_ups_on_previous_replica": len(stayed),
        "follow_up_cached_share": sum(s.cached_tokens for s in later) / prompt if prompt else None,
        "requests_per_replica": sorted(per_replica.values(), reverse=True),
    }


def same_answers(samples: Sequence[Sample]) -> bool:
    """Whether every (user, step) got the same answer in every routing mode."""
    answers: dict[tuple[int, int], set[str]] = {}
    for s in samples:
        if s.error is None:
            answers.setdefault((s.user, s.step), set()).add(s.answer)
    return all(len(a) == 1 for a in answers.values())


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v / 1000:.1f} s"

    lines = ["| routing | first turn TTFT / e2e (p50) | follow-up TTFT / e2e (p50) | "
             "follow-up TTFT / e2e (mean) | follow-ups on previous replica | "
             "follow-up tokens cached | requests per replica | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for routing, s in summaries.items():
        share = s["follow_up_cached_share"]
        lines.append(
            f"| {routing} | {ms(s['first_ttft_ms_p50'])} / {ms(s['first_e2e_ms_p50'])} | "
            f"{ms(s['follow_up_ttft_ms_p50'])} / {ms(s['follow_up_e2e_ms_p50'])} | "
            f"{ms(s['follow_up_ttft_ms_mean'])} / {ms(s['follow_up_e2e_ms_mean'])} | "
            f"{s['follow_ups_on_previous_replica']}/{s['follow_ups']} | "
            f"{'-' if share is None else f'{share:.0%}'} | {s['requests_per_replica']} | "
            f"{s['errors']} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.affinity",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Multi-turn agents (one tenant each) on two MainModel replicas, with "
                    "cache-affinity routing and with Serve's own router, in one run; starts "
                    "and stops the app for each.")
    parser.add_argument("--config", type=Path, default=Path("configs/local-autoscale.yaml"),
                        help="Serve config the app starts from (MainModel held at 2 replicas; "
                             "its request_router_config kept or removed)")
    parser.add_argument("--port", type=int, default=8126, help="HTTP port of the started app")
    parser.add_argument("--routings", default=",".join(ROUTINGS),
                        help=f"routing modes, in order (of: {', '.join(ROUTINGS)})")
    parser.add_argument("--category", default="multi_turn_base",
                        help=f"BFCL multi-turn category (of: {', '.join(MULTI_CATEGORIES)})")
    parser.add_argument("--users", type=int, default=4, help="users (tenants), one "
                        "conversation each, all at once")
    parser.add_argument("--steps", type=int, default=5, help="requests per conversation, at most")
    parser.add_argument("--max-tokens", type=int, default=48, help="max_tokens per request")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    return parser


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] | None = None) -> int:
    args = build_parser().parse_args(argv)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    routings = args.routings.split(",")
    unknown = sorted(set(routings) - set(ROUTINGS))
    if unknown:
        raise SystemExit(f"unknown routing {unknown}: use {', '.join(ROUTINGS)}")
    from deployments import local

    conversations = user_conversations(load_bfcl_multi(args.category, args.users),
                                       args.users, args.steps)
    base = local.load_serve_config(args.config)
    samples: list[Sample] = []
    for routing in routings:
        config = serve_config(base, routing, args.users, args.port)
        say(f"affinity: starting {args.config} with two MainModel replicas, routing {routing}")
        url = local.start(config)
        try:
            wait_for_main_replicas(config["applications"][0]["name"], 2)
            began = time.monotonic()
            samples += run_users(url, routing, conversations, args.max_tokens, args.timeout)
            say(f"affinity: {routing}: {len(conversations)} users done in "
                f"{time.monotonic() - began:.0f} s")
        finally:
            local.stop()
    summaries = {r: summarize([s for s in samples if s.routing == r]) for r in routings}
    identical = same_answers(samples)
    print(format_table(summaries))
    print(f"answers identical across routings: {identical}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summaries": summaries, "identical": identical,
                                         "samples": [asdict(s) for s in samples]}, indent=1))
    return 0 if identical and not any(s.error for s in samples) else 1


if __name__ == "__main__":
    raise SystemExit(main())
