"""Collection: the main model's own committed calls on a dataset, as `Sample`s.

Each case goes through `MainModelService` in-process, `prepare` then `run`, exactly as the
MainModel deployment serves a request with `ooo_spec.enabled: false` (plain decoding): the
same chat template, forced-call grammar and sampling. The request is the one the benchmark
sends (`load_tests/bench/`: `tool_choice: required`, temperature 0, max_tokens 256, one
call), so the calls collected are the calls the sidecar is later measured against, on other
questions. Outputs cut short by max_tokens commit no call and are left out.

Sources (`load_cases`): BFCL categories other than the measured ones (`MEASURED`, refused
here, and any case whose question is word for word a measured one's is dropped, so no measured
question is ever trained on), among them the retired executable categories (`exec_simple`,
`exec_multiple`, ...: Python functions like the measured ones'), and synthetic tool sets
(`toolsets:<category>`: each question with its own tools plus a few other questions' JSON
Schemas, so the main model chooses among tools it was not asked about), and the agent
scenarios (`agent`: app/datasets/agent_scenarios.py, each conversation up to the call its last
turn asks for, with its own tool choice; their tools are the ones the config's tool workers
register, as `GET /v1/tools` lists them: `tool_listing`). Not the router's history store: it
lives in each main replica's memory only (app/drafting/history.py), by the privacy rules, and
nothing reads it out. Both datasets are the product's own (`app/datasets/`), never the
benchmark's.

Collection is a log (`CollectionLog`): each case's sample is appended as soon as it is done
(or its id to the skipped list), so a stopped collection resumes where it was, and a larger
`--limit` or another source collects only the new cases.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.config import AppConfig
from app.distill.pairs import TOOLSETS_PREFIX, CommittedCall, Sample
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest

# The benchmark's agreement cases (issue: BFCL simple_python + multiple): never collected.
MEASURED = frozenset({"simple_python", "multiple"})
# The third adapter's (app/distill/README.md, "Measured").
DEFAULT_SOURCES = ("bfcl:exec_simple", "bfcl:exec_multiple", "bfcl:exec_parallel",
                   "bfcl:exec_parallel_multiple", "bfcl:parallel", "bfcl:parallel_multiple",
                   "bfcl:live_simple", "bfcl:live_multiple", "toolsets:exec_simple",
                   "toolsets:parallel", "toolsets:live_simple")
MAX_TOKENS = 256  # the benchmark's
AGENT_SOURCE = "agent"  # app/datasets/agent_scenarios.py's SOURCE
# Tools added to a question's own in a synthetic tool set: BFCL's `multiple` offers 2 to 4.
MAX_DISTRACTORS = 3


class DistillCase(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    source: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    # "required" (BFCL's) or a named tool's {"type": "function", ...} (an agent scenario's).
    tool_choice: str | dict[str, Any] = "required"


def request_body(case: DistillCase) -> dict[str, Any]:
    """The chat request the benchmark sends for a case, in plain mode."""
    return {
        "model": "main", "messages": case.messages, "tools": case.tools,
        "tool_choice": case.tool_choice, "temperature": 0.0, "max_tokens": MAX_TOKENS,
        "ooo_spec": {"enabled": False, "history": False},
    }


async def tool_listing(config: AppConfig) -> list[dict[str, Any]]:
    """The tools a server of `config` lists (`GET /v1/tools`): its tool modules and MCP
    servers registered as a ToolWorker replica registers them."""
    from app.tools.mcp_source import McpToolSource
    from app.tools.registry import ToolRegistry

    registry = ToolRegistry()
    registry.load_modules(config.tools)
    mcp = McpToolSource(config.tool_worker.mcp_servers)
    await mcp.start(registry)
    try:
        registry.apply_overrides(config.tool_worker.overrides)
        return registry.openai_tools()
    finally:
        await mcp.aclose()


def agent_cases(listing: Sequence[dict[str, Any]], limit: int | None) -> list[DistillCase]:
    """The agent scenarios, up to `limit`, over the tools of `listing`, each with its own
    tool choice."""
    from app.datasets.agent_scenarios import load_agent_cases

    return [DistillCase(id=c.id, source=AGENT_SOURCE, messages=c.messages, tools=c.tools,
                        tool_choice=c.tool_choice)
            for c in load_agent_cases(listing, limit)]


def load_cases(
    sources: Sequence[str], limit: int | None,
    listing: Sequence[dict[str, Any]] | None = None,
) -> list[DistillCase]:
    """Up to `limit` cases per source, none with a measured question: `bfcl:<category>`,
    `toolsets:<category>` (that category's questions with synthetic tool sets,
    `with_distractors`), or `agent` (the agent scenarios over the tools of `listing`,
    `tool_listing`)."""
    from app.datasets.bfcl import load_bfcl

    cases: list[DistillCase] = []
    for source in sources:
        if source == AGENT_SOURCE:
            if listing is None:
                raise ValueError("the agent source needs the server's tool listing")
            cases += agent_cases(listing, limit)
            continue
        kind, _, category = source.partition(":")
        if kind not in ("bfcl", "toolsets") or not category:
            raise ValueError(f"unknown source {source!r}: bfcl:<category>, "
                             f"toolsets:<category> or {AGENT_SOURCE}")
        if category in MEASURED:
            raise ValueError(f"{source}: measured by the benchmark, never trained on")
        every = load_bfcl(category)
        loaded = [DistillCase(id=c.id, source=source, messages=c.messages, tools=c.tools)
                  for c in every[:limit]]
        if kind == "toolsets":
            # Distractors from the whole category, not only the first `limit` cases.
            pool = [t for c in every for t in c.tools]
            loaded = [with_distractors(c, pool) for c in loaded]
        cases += loaded
    measured = [c.messages for category in sorted(MEASURED) for c in load_bfcl(category)]
    return without_questions(cases, measured)


def with_distractors(case: DistillCase, pool: Sequence[dict[str, Any]],
                     most: int = MAX_DISTRACTORS) -> DistillCase:
    """`case` with a synthetic tool set: its own tools plus 1 to `most` tools of `pool` (other
    questions' JSON Schemas) that it does not name, shuffled, as BFCL's `multiple` builds a
    case. Drawn from a hash of the case id, so the same case always gets the same set. The
    main model then chooses among them: its choice is the name pair, its arguments the slots
    of the tool it chose."""
    rng = random.Random(hashlib.sha256(case.id.encode()).digest())
    own = {t["function"]["name"] for t in case.tools}
    others = sorted({t["function"]["name"]: t for t in pool
                     if t["function"]["name"] not in own}.items())
    if not others:
        return case
    picked = [t for _, t in rng.sample(others, min(len(others), rng.randint(1, most)))]
    tools = [*case.tools, *picked]
    rng.shuffle(tools)
    return case.model_copy(update={"id": TOOLSETS_PREFIX + case.id, "tools": tools})


def question(messages: Sequence[dict[str, Any]]) -> str:
    """A conversation's user text, normalised for comparison (case and spacing)."""
    text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    return " ".join(text.lower().split())


def without_questions(
    cases: Sequence[DistillCase], conversations: Iterable[Sequence[dict[str, Any]]]
) -> list[DistillCase]:
    """`cases` less the ones asking a question of `conversations` (the measured cases')."""
    banned = {question(c) for c in conversations}
    return [c for c in cases if question(c.messages) not in banned]


class CollectionLog:
    """The samples collected so far (`samples.jsonl`) and the ids of the cases that gave none
    (`samples.jsonl.skipped`), appended one case at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped = path.with_name(path.name + ".skipped")

    def done(self) -> set[str]:
        ids = {s.case_id for s in read_samples(self.path)} if self.path.is_file() else set()
        if self.skipped.is_file():
            ids |= set(self.skipped.read_text(encoding="utf-8").split())
        return ids

    def add(self, case: DistillCase, sample: Sample | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        target, line = ((self.path, sample.model_dump_json()) if sample is not None
                        else (self.skipped, case.id))
        with target.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


async def collect_one(service: MainModelService, case: DistillCase) -> Sample | None:
    request = ChatCompletionRequest.model_validate(request_body(case))
    final = await service.complete(service.prepare(request))
    if final.finish_reason == "length" or not final.calls:
        return None
    return Sample(case_id=case.id, source=case.source, request=request_body(case),
                  text=final.text,
                  calls=[CommittedCall(name=c.name, arguments=c.arguments) for c in final.calls])


async def collect(
    service: MainModelService, cases: Sequence[DistillCase], concurrency: int = 4,
    on_done: Callable[[DistillCase, Sample | None], None] | None = None,
) -> list[Sample]:
    """Every case through the main model, `concurrency` at a time (the engine batches them);
    a case the server would refuse (a 4xx) is skipped like one cut short."""
    gate = asyncio.Semaphore(concurrency)

    async def one(case: DistillCase) -> Sample | None:
        async with gate:
            try:
                sample = await collect_one(service, case)
            except Exception:  # refused (too long for the context, schema it cannot compile)
                sample = None
            if on_done is not None:
                on_done(case, sample)
            return sample

    results = await asyncio.gather(*(one(c) for c in cases))
    return [s for s in results if s is not None]


def read_samples(path: Path) -> list[Sample]:
    return [Sample.model_validate(json.loads(line))
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
