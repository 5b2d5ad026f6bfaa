"""Autoscaling on the local app (issue #21): a burst of requests takes the main model from 1 to 2
replicas and the tool workers up; after the burst both go back to 1, and the requests running
while a replica is removed complete (Serve's graceful shutdown), streamed ones included. Every
answer is token-identical to plain decoding of the same request.

The session app is redeployed with the `deployments:` entries of configs/local-autoscale.yaml
(its `args` and each replica's `ray_actor_options` are local.yaml's, so no replica restarts:
Serve applies the autoscaling and shutdown options to the running ones), through Serve's
declarative API as deployments/local.py deploys it, and put back as it was at
the end: only one app runs on this small machine, and the tests after this one see the session
config.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.cluster import ROOT, serve_details, settled, wait_for

pytestmark = pytest.mark.e2e

AUTOSCALE = ROOT / "configs" / "local-autoscale.yaml"
KEYS = ("paris", "london", "tokyo", "rome", "berlin", "madrid", "lisbon", "vienna")
# Concurrent requests during the burst: three times the main model's target of 4 ongoing
# requests, so the autoscaler asks for a second replica (and more tool workers) at once. More
# users only lengthen every request on this 2-core machine (24 took 80 s a request).
BURST_USERS = 12
TRICKLE_USERS = 3          # below one replica's target: the main model scales down under them
SCALE_UP_TIMEOUT_S = 300   # the burst runs until the second main replica serves, at most this
SCALE_DOWN_TIMEOUT_S = 150
RESTART_TIMEOUT_S = 600


# --- requests and their answers ---------------------------------------------------------------


def body(key: str, *, ooo: bool, stream: bool) -> dict[str, Any]:
    """Look up `key` with the slow tool, run by the tool workers (500 ms each call)."""
    tool = {"type": "function", "function": {
        "name": "slow_lookup", "description": "Look up a record in a slow store.",
        "parameters": {"type": "object", "required": ["key"], "properties": {
            "key": {"type": "string", "enum": list(KEYS)}}}}}
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Look up the record '{key}'."}],
        "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "slow_lookup"}},
        "temperature": 0, "max_tokens": 48,
        "ooo_spec": {"enabled": ooo, "execute_tools": True, "max_steps": 1,
                     "server_tools": True},  # the server runs slow_lookup (opt-in)
    }
    if stream:
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    return request


@dataclass(frozen=True)
class Answer:
    """What must be identical with and without speculation: the text, the tool calls (name and
    arguments; ids are random), the tool results and the number of completion tokens."""

    content: str | None
    tool_calls: tuple[tuple[str, str], ...]
    tool_results: tuple[tuple[str, str], ...]
    completion_tokens: int


def answer(message: dict[str, Any], usage: dict[str, Any], report: dict[str, Any]) -> Answer:
    return Answer(
        content=message.get("content"),
        tool_calls=tuple((c["function"]["name"], c["function"]["arguments"])
                         for c in message.get("tool_calls") or []),
        tool_results=tuple((r["name"], r["content"]) for r in report["tool_results"]),
        completion_tokens=int(usage["completion_tokens"]),
    )


def from_stream(text: str) -> Answer:
    """Reassemble the SSE stream: content and tool calls arrive whole (tools are in play)."""
    message: dict[str, Any] = {"content": None, "tool_calls": []}
    usage: dict[str, Any] | None = None
    report: dict[str, Any] | None = None
    done = False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        assert "error" not in event, event
        for choice in event.get("choices") or []:
            delta = choice["delta"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            message["tool_calls"].extend(delta.get("tool_calls") or [])
        usage = event.get("usage") or usage
        report = event.get("ooo_spec") or report
    assert done and usage is not None and report is not None, text[-2000:]
    return answer(message, usage, report)


def ask(url: str, key: str, *, ooo: bool, stream: bool) -> Answer:
    r = httpx.post(f"{url}/v1/chat/completions", json=body(key, ooo=ooo, stream=stream),
                   timeout=240)
    assert r.status_code == 200, (r.status_code, r.text[:2000])
    if stream:
        return from_stream(r.text)
    data = r.json()
    return answer(data["choices"][0]["message"], data["usage"], data["ooo_spec"])


@dataclass
class Outcome:
    key: str
    stream: bool
    started: float
    ended: float
    result: Answer | str  # the answer, or what went wrong


@dataclass
class Users:
    """`count` closed-loop users sending speculative requests (every other one streamed) until
    stopped; every outcome is kept with its start and end time."""

    url: str
    count: int
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, user: int) -> None:
        turn = 0
        while not self._stop.is_set():
            key = KEYS[(user + turn) % len(KEYS)]
            stream = (user + turn) % 2 == 1
            turn += 1
            started = time.monotonic()
            try:
                result: Answer | str = ask(self.url, key, ooo=True, stream=stream)
            except (AssertionError, httpx.HTTPError) as exc:
                result = repr(exc)
            self.outcomes.append(Outcome(key, stream, started, time.monotonic(), result))

    def __enter__(self) -> Users:
        self._threads = [threading.Thread(target=self._run, args=(u,), daemon=True)
                         for u in range(self.count)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)
        assert not any(t.is_alive() for t in self._threads), "a request never came back"


# --- what Serve runs ---------------------------------------------------------------------------


def replica_states() -> dict[str, list[str]]:
    """Each deployment's replica states (STARTING, RUNNING, STOPPING, ...)."""
    return {name: [r["state"] for r in d["replicas"]]
            for name, d in serve_details()["deployments"].items()}


def running(states: dict[str, list[str]], name: str) -> int:
    return states.get(name, []).count("RUNNING")


@dataclass
class Sampler:
    """Replica states of every deployment, sampled twice a second in a thread."""

    samples: list[tuple[float, dict[str, list[str]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), replica_states()))
            except Exception:  # noqa: BLE001 - the controller is busy; the next sample counts
                pass
            self._stop.wait(0.5)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def latest(self) -> dict[str, list[str]]:
        return self.samples[-1][1] if self.samples else {}

    def first(self, predicate: Callable[[dict[str, list[str]]], bool]) -> float | None:
        return next((t for t, s in self.samples if predicate(s)), None)


def autoscaled(session: dict[str, Any]) -> dict[str, Any]:
    """The session's Serve config with local-autoscale.yaml's `deployments:` entries (the
    session's other entries stay)."""
    with open(AUTOSCALE) as f:
        (app,) = yaml.safe_load(f)["applications"]
    entries = {e["name"]: e for e in app["deployments"]}
    config = copy.deepcopy(session)
    (target,) = config["applications"]
    target["deployments"] = [copy.deepcopy(entries.get(e["name"], e))
                             for e in target["deployments"]]
    return config


def holds(name: str, max_replicas: int) -> bool:
    held = serve_details()["deployments"][name]["deployment_config"]["autoscaling_config"]
    return int(held["max_replicas"]) == max_replicas


@pytest.fixture(scope="module")
def autoscale_url(app_url: str, serve_config: dict[str, Any]) -> Iterator[str]:
    """The session app with local-autoscale.yaml's deployment options; restored afterwards."""
    from deployments import local

    wait_for("the session app settled", settled, RESTART_TIMEOUT_S, every_s=1)
    try:
        local.deploy(autoscaled(serve_config))
        wait_for("the autoscale options held, one replica each",
                 lambda: holds("MainModel", 2) and settled()
                 and all(len(s) == 1 for s in replica_states().values()),
                 RESTART_TIMEOUT_S, every_s=1)
        local.wait_ready(app_url)
        yield app_url
    finally:
        local.deploy(serve_config)
        wait_for("the session config restored",
                 lambda: holds("MainModel", 1) and settled()
                 and all(len(s) == 1 for s in replica_states().values()),
                 RESTART_TIMEOUT_S, every_s=1)
        local.wait_ready(app_url)


def summary(sampler: Sampler, burst: list[Outcome], trickle: list[Outcome]) -> str:
    """What happened, for the log (`pytest -s`): replica counts when they changed, requests."""
    t0 = sampler.samples[0][0] if sampler.samples else 0.0
    lines, last = [], None
    for t, states in sampler.samples:
        counts = {n: f"{s.count('RUNNING')}/{len(s)}" for n, s in sorted(states.items())}
        if counts != last:
            lines.append(f"  {t - t0:6.1f} s  running/all: {counts}")
            last = counts
    for name, outcomes in (("burst", burst), ("trickle", trickle)):
        took = sorted(o.ended - o.started for o in outcomes)
        if took:
            lines.append(f"  {name}: {len(outcomes)} requests "
                         f"({sum(o.stream for o in outcomes)} streamed), "
                         f"p50 {took[len(took) // 2]:.1f} s, max {took[-1]:.1f} s")
    return "autoscaling:\n" + "\n".join(lines)


# --- the test ----------------------------------------------------------------------------------


def test_burst_scales_up_then_down_without_loss(autoscale_url: str) -> None:
    url = autoscale_url
    # Plain decoding of every request, one at a time, before any scaling: the reference.
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = dict(zip(KEYS, pool.map(lambda k: ask(url, k, ooo=False, stream=False), KEYS),
                         strict=True))
    assert all(a.tool_results and a.tool_calls == () for a in plain.values()), plain

    with Sampler() as sampler:
        # 1. The burst: it goes on until a second main replica and a second tool worker run,
        #    then until as many requests as there are users started after that (power of two
        #    choices spreads them over both main replicas).
        with Users(url, BURST_USERS) as burst:
            wait_for("a second MainModel and ToolWorker replica running",
                     lambda: running(sampler.latest(), "MainModel") == 2
                     and running(sampler.latest(), "ToolWorker") >= 2,
                     SCALE_UP_TIMEOUT_S, every_s=0.5)
            scaled_at = time.monotonic()
            wait_for("a user's worth of answers after the scale-up",
                     lambda: sum(o.started > scaled_at for o in burst.outcomes)
                     >= BURST_USERS, SCALE_UP_TIMEOUT_S)
        # 2. Light load: the main model goes back to one replica under these requests.
        with Users(url, TRICKLE_USERS) as trickle:
            wait_for("MainModel back to one replica",
                     lambda: sampler.latest().get("MainModel") == ["RUNNING"],
                     SCALE_DOWN_TIMEOUT_S, every_s=0.5)
            # Requests are still sent after the scale-down, and answered by the one left.
            down_at = time.monotonic()
            wait_for("answers after the scale-down",
                     lambda: sum(o.started > down_at for o in trickle.outcomes) >= TRICKLE_USERS,
                     120)
        # 3. No load: the router and the tool workers go back to one replica too.
        wait_for("every deployment back to one replica",
                 lambda: all(s == ["RUNNING"] for s in sampler.latest().values()),
                 SCALE_DOWN_TIMEOUT_S, every_s=0.5)

    print(summary(sampler, burst.outcomes, trickle.outcomes))
    # Every request of the burst and after it: 200 and token-identical to plain decoding.
    outcomes = burst.outcomes + trickle.outcomes
    failed = [o for o in outcomes if not isinstance(o.result, Answer)]
    assert not failed, failed[:5]
    differ = [(o.key, o.stream, o.result, plain[o.key]) for o in outcomes
              if o.result != plain[o.key]]
    assert not differ, differ[:3]
    assert any(o.stream for o in burst.outcomes) and any(not o.stream for o in burst.outcomes)

    # The counts went 1 -> 2 -> 1 for the main model and up and down for the tool workers.
    main_up = sampler.first(lambda s: running(s, "MainModel") == 2)
    tools_up = sampler.first(lambda s: running(s, "ToolWorker") >= 2)
    assert main_up is not None and tools_up is not None
    # A main replica was stopped while requests (streamed ones too) were running: they are
    # among the outcomes above, all answered and identical.
    stopping = [t for t, s in sampler.samples if "STOPPING" in s.get("MainModel", [])]
    assert stopping, "no MainModel replica was seen stopping"
    spanning = [o for o in trickle.outcomes if o.started < stopping[0] < o.ended]
    assert spanning, "no request was running when the main replica began stopping"
    assert any(o.stream for o in trickle.outcomes if o.started < stopping[-1]), trickle.outcomes
