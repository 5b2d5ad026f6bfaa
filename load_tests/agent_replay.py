"""Several agents at once on multi-turn traffic: `concurrency.py --conversations`.

Each agent is a tenant (its own API key, `--api-keys`) replaying its share of BFCL's multi-turn
conversations step by step (load_tests/bfcl_multi.py: the ground-truth history with real tool
results, so every mode sends exactly the same requests), closed loop: an agent sends its next
step when the previous one has answered. At each level (1, 4, 16 agents) every mode replays the
same conversations, one block per mode, the modes' order rotated from level to level (as the
bench rotates them per case). Modes are the bench's (load_tests/bench/modes.py: `plain`,
`ngram`, `suffix`, `drafts`, `ooo`, ...), selected per request by their `ooo_spec` body.

Requests are streamed: the client's time to first token is the first chunk that carries
output (content, reasoning or a tool call), which counts everything the server does before the
main model's first token (the router's sidecar decision and start included). Reported per level
and mode: requests per second over the block's wall time, p50 and p95 end to end and time to
first token, main-model passes (`ooo_spec.main.steps`) and tokens committed per pass, and how
many answers differ from the reference mode's (`plain`, else the first) at the same level.

With `--warmup-key`, each mode first answers one step of a conversation outside the replayed
ones, under a tenant apart from the agents' (its own prefix cache and suffix memory), so the
first mode on a fresh server does not pay the server's own warm-up (tens of seconds on the CPU
machine) for the others.

Each mode keeps its own memory of earlier outputs (`ooo_spec.diagnostics.suffix_scope`, as the
bench does), so no mode is drafted another's answer; history candidates are off.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from load_tests.bench.modes import BASELINE, Mode
from load_tests.bfcl_multi import MultiTurnStep

DEFAULT_MODES = "plain,ngram,suffix,drafts,ooo"


@dataclass(frozen=True)
class Sample:
    """One request of one agent in one block."""

    agents: int  # the level: agents running at once
    mode: str
    agent: int
    step_id: str  # MultiTurnStep.id: "<conversation>#<index>"
    start_s: float  # since the block began
    e2e_ms: float
    ttft_ms: float | None  # None: no output chunk came
    completion_tokens: int = 0
    passes: int | None = None  # ooo_spec.main.steps
    answer: str = ""  # content and tool calls, joined from the stream
    error: str | None = None


def by_conversation(steps: Sequence[MultiTurnStep]) -> list[list[MultiTurnStep]]:
    """`steps` grouped by conversation, the conversations in their first step's order."""
    grouped: dict[str, list[MultiTurnStep]] = {}
    for step in steps:
        grouped.setdefault(step.conversation, []).append(step)
    return list(grouped.values())


def agent_conversations(steps: Sequence[MultiTurnStep], agents: int, conversations: int,
                        max_steps: int | None = None) -> list[list[MultiTurnStep]]:
    """The first `conversations` conversations dealt round-robin to `agents` agents, each as the
    list of steps the agent sends in order (a conversation's steps in BFCL's order, cut to
    `max_steps`). Every level deals the same conversations, so every level does the same work.

    >>> from load_tests.bfcl_multi import ExpectedCall
    >>> def step(c: str, i: int) -> MultiTurnStep:
    ...     return MultiTurnStep(id=f"{c}#{i}", category="x", conversation=c, index=i, turn=0,
    ...                          messages=[], tools=[],
    ...                          expected=ExpectedCall(name="f", arguments={}))
    >>> dealt = agent_conversations([step("a", 1), step("a", 0), step("b", 0), step("c", 0)],
    ...                             2, 3)
    >>> [[s.id for s in agent] for agent in dealt]
    [['a#0', 'a#1', 'c#0'], ['b#0']]
    """
    chosen = by_conversation(steps)[:conversations]
    if len(chosen) < agents:
        raise ValueError(f"{len(chosen)} conversations for {agents} agents")
    dealt: list[list[MultiTurnStep]] = [[] for _ in range(agents)]
    for n, conversation in enumerate(chosen):
        dealt[n % agents] += sorted(conversation, key=lambda s: s.index)[:max_steps]
    return dealt


def warmup_step(steps: Sequence[MultiTurnStep], conversations: int) -> MultiTurnStep:
    """The first step of the conversation after the first `conversations` (those the levels
    replay): what each mode answers once, uncounted, before the first block.

    >>> from load_tests.bfcl_multi import ExpectedCall
    >>> def step(c: str, i: int) -> MultiTurnStep:
    ...     return MultiTurnStep(id=f"{c}#{i}", category="x", conversation=c, index=i, turn=0,
    ...                          messages=[], tools=[],
    ...                          expected=ExpectedCall(name="f", arguments={}))
    >>> warmup_step([step("a", 0), step("b", 1), step("b", 0)], 1).id
    'b#0'
    """
    rest = by_conversation(steps)[conversations:]
    if not rest:
        raise ValueError(f"no conversation beyond the {conversations} replayed to warm up on")
    return min(rest[0], key=lambda s: s.index)


def block_order(levels: Sequence[int], modes: Sequence[str]) -> list[tuple[int, str]]:
    """(agents, mode) blocks, the modes rotated by one from each level to the next, so no mode
    always runs first (on the coldest server) or right after the same other mode.

    >>> block_order([1, 4], ["plain", "ooo", "drafts"])
    [(1, 'plain'), (1, 'ooo'), (1, 'drafts'), (4, 'ooo'), (4, 'drafts'), (4, 'plain')]
    """
    order: list[tuple[int, str]] = []
    for index, agents in enumerate(levels):
        shift = index % len(modes) if modes else 0
        order += [(agents, mode) for mode in [*modes[shift:], *modes[:shift]]]
    return order


def request_body(step: MultiTurnStep, mode: Mode, max_tokens: int) -> dict[str, Any]:
    """The streamed chat request of `step` in `mode`: forced call, greedy, the mode's
    `ooo_spec`, its own suffix memory, no history candidates."""
    body: dict[str, Any] = {
        "messages": step.messages, "tools": step.tools, "tool_choice": "required",
        "temperature": 0, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(json.loads(json.dumps(dict(mode.extra_body))))  # a private copy
    options = body.setdefault("ooo_spec", {})
    options["history"] = False
    options.setdefault("diagnostics", {})["suffix_scope"] = f"agents:{mode.name}"
    return body


@dataclass
class StreamState:
    """A streamed chat completion joined as it arrives (one choice)."""

    content: str = ""
    calls: dict[int, list[str]] | None = None  # index -> [name, arguments]
    first_output: bool = False
    usage: Mapping[str, Any] | None = None
    report: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any]) -> bool:
        """Take one chunk; True when it is the first that carries output."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("ooo_spec"):
            self.report = chunk["ooo_spec"]
        output = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content += delta["content"]
                output = True
            if delta.get("reasoning_content") or delta.get("reasoning"):
                output = True
            for call in delta.get("tool_calls") or []:
                calls = self.calls if self.calls is not None else {}
                self.calls = calls
                entry = calls.setdefault(int(call.get("index", 0)), ["", ""])
                function = call.get("function") or {}
                entry[0] += function.get("name") or ""
                entry[1] += function.get("arguments") or ""
                output = True
        first = output and not self.first_output
        self.first_output = self.first_output or output
        return first

    def answer(self) -> str:
        """Content and calls as one comparable string (arguments as parsed JSON, so key
        spacing the stream split differently never counts as a difference)."""
        calls = []
        for _, (name, arguments) in sorted((self.calls or {}).items()):
            try:
                parsed: Any = json.loads(arguments) if arguments else None
            except ValueError:
                parsed = arguments
            calls.append([name, parsed])
        return json.dumps([self.content or None, calls], sort_keys=True)


def summarize(samples: Sequence[Sample], elapsed_s: float) -> dict[str, Any]:
    """One block's numbers; rates over its whole wall time (`elapsed_s`)."""
    ok = [s for s in samples if s.error is None]
    e2e = sorted(s.e2e_ms for s in ok)
    ttft = sorted(s.ttft_ms for s in ok if s.ttft_ms is not None)
    passes = [s.passes for s in ok if s.passes is not None]
    tokens = sum(s.completion_tokens for s in ok if s.passes is not None)
    first = samples[0] if samples else None
    return {
        "agents": first.agents if first else None, "mode": first.mode if first else None,
        "requests": len(ok), "errors": len(samples) - len(ok), "elapsed_s": elapsed_s,
        "requests_per_s": len(ok) / elapsed_s if elapsed_s > 0 else 0.0,
        "e2e_p50_ms": _pct(e2e, 0.5), "e2e_p95_ms": _pct(e2e, 0.95),
        "ttft_p50_ms": _pct(ttft, 0.5), "ttft_p95_ms": _pct(ttft, 0.95),
        "passes": sum(passes),
        "tokens_per_pass": tokens / sum(passes) if sum(passes) else None,
    }


def _pct(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-quantile (the median interpolated, others nearest rank).

    >>> _pct([1.0, 2.0, 3.0, 4.0], 0.5), _pct([1.0, 2.0, 3.0, 4.0], 0.95), _pct([], 0.5)
    (2.5, 4.0, None)
    """
    if not sorted_values:
        return None
    if q == 0.5:
        return statistics.median(sorted_values)
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def differences(samples: Sequence[Sample], reference: str = BASELINE) -> dict[tuple[int, str], int]:
    """Per (agents, mode): answers that differ from the reference mode's to the same step at
    the same level (`reference`, else the first mode seen); steps either side failed are not
    compared. Zero everywhere: outputs identical across modes."""
    modes = list(dict.fromkeys(s.mode for s in samples))
    ref = reference if reference in modes else (modes[0] if modes else reference)
    answers = {(s.agents, s.step_id): s.answer for s in samples
               if s.mode == ref and s.error is None}
    counts: dict[tuple[int, str], int] = {}
    for s in samples:
        key = (s.agents, s.mode)
        counts.setdefault(key, 0)
        expected = answers.get((s.agents, s.step_id))
        if s.error is None and expected is not None and s.answer != expected:
            counts[key] += 1
    return counts


def format_table(summaries: Sequence[Mapping[str, Any]],
                 diffs: Mapping[tuple[int, str], int]) -> str:
    lines = ["| agents | mode | requests | errors | req/s | e2e p50 / p95 | TTFT p50 / p95 | "
             "passes | tokens / pass | answers unlike plain |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        tpp = s["tokens_per_pass"]
        lines.append(
            f"| {s['agents']} | {s['mode']} | {s['requests']} | {s['errors']} | "
            f"{s['requests_per_s']:.3f} | {_ms(s['e2e_p50_ms'])} / {_ms(s['e2e_p95_ms'])} | "
            f"{_ms(s['ttft_p50_ms'])} / {_ms(s['ttft_p95_ms'])} | {s['passes']:,} | "
            f"{'-' if tpp is None else f'{tpp:.2f}'} | "
            f"{diffs.get((s['agents'], s['mode']), 0)} |")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


# ----- the run (I/O) --------------------------------------------------------------------------

async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float,
                ) -> tuple[StreamState, float | None, str | None]:
    """One streamed request: the joined stream, the time to its first output (ms), an error."""
    state = StreamState()
    started = time.monotonic()
    ttft: float | None = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             timeout=timeout_s) as reply:
        if reply.status_code != 200:
            text = (await reply.aread()).decode(errors="replace")
            return state, None, f"HTTP {reply.status_code}: {text[:200]}"
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if state.add(json.loads(line[len("data: "):])):
                ttft = (time.monotonic() - started) * 1000
    return state, ttft, None


async def _agent(url: str, key: str | None, agent: int, steps: Sequence[MultiTurnStep],
                 mode: Mode, agents: int, max_tokens: int, timeout_s: float, t0: float,
                 out: list[Sample]) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers) as client:
        for step in steps:
            started = time.monotonic()
            try:
                state, ttft, error = await _send(client, url,
                                                 request_body(step, mode, max_tokens), timeout_s)
            except (httpx.HTTPError, ValueError) as exc:
                state, ttft, error = StreamState(), None, f"{type(exc).__name__}: {exc}"
            main = (state.report or {}).get("main") or {}
            out.append(Sample(
                agents, mode.name, agent, step.id, started - t0,
                (time.monotonic() - started) * 1000, ttft,
                int((state.usage or {}).get("completion_tokens") or 0),
                main.get("steps"), state.answer(), error))


async def run_block(url: str, dealt: Sequence[Sequence[MultiTurnStep]], mode: Mode,
                    keys: Sequence[str | None], max_tokens: int, timeout_s: float,
                    ) -> tuple[list[Sample], float]:
    """Every agent replays its steps at once; the samples and the block's wall time."""
    samples: list[Sample] = []
    t0 = time.monotonic()
    await asyncio.gather(*(
        _agent(url, keys[agent % len(keys)], agent, steps, mode, len(dealt), max_tokens,
               timeout_s, t0, samples)
        for agent, steps in enumerate(dealt)))
    return samples, time.monotonic() - t0


async def run(url: str, levels: Sequence[int], modes: Sequence[Mode],
              steps: Sequence[MultiTurnStep], conversations: int, max_steps: int | None,
              keys: Sequence[str | None], max_tokens: int, timeout_s: float,
              say: Any = print, warmup_key: str | None = None) -> dict[str, Any]:
    """Every (level, mode) block in `block_order`. `warmup_key`: a tenant apart from the
    agents' answers `warmup_step` once per mode first, uncounted: otherwise the first block on
    a fresh server pays the server's own warm-up, and whichever mode runs first loses by it."""
    by_name = {m.name: m for m in modes}
    summaries: list[dict[str, Any]] = []
    samples: list[Sample] = []
    if warmup_key is not None:
        warm = warmup_step(steps, conversations)
        for mode in modes:
            say(f"agents: warming up, {mode.name}, {warm.id}")
            await _agent(url, warmup_key, -1, [warm], mode, 0, max_tokens, timeout_s,
                         time.monotonic(), [])
    for agents, name in block_order(levels, [m.name for m in modes]):
        dealt = agent_conversations(steps, agents, conversations, max_steps)
        say(f"agents: {agents} at once, {name}, {sum(len(d) for d in dealt)} requests")
        block, elapsed = await run_block(url, dealt, by_name[name], keys, max_tokens, timeout_s)
        summaries.append(summarize(block, elapsed))
        samples += block
    diffs = differences(samples)
    return {"summaries": summaries,
            "differences": [{"agents": a, "mode": m, "differ": n} for (a, m), n in diffs.items()],
            "samples": [asdict(s) for s in samples]}
