"""The bench's datasets: the sources `--dataset` accepts, in the registry `DATASETS`
(`register_dataset`), which `--help` reads; a `--dataset` spec parsed, and its cases loaded."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.datasets.agent_scenarios import AgentCase
from load_tests.bfcl import CORE_CATEGORIES, SUPPORTED_CATEGORIES, BfclCase, load_bfcl
from load_tests.bfcl_multi import MULTI_CATEGORIES, MultiTurnStep, load_bfcl_multi

AGENT_SOURCE = "agent"
BFCL_AUTO = "bfcl-auto"
AGENT_AUTO = "agent-auto"
BFCL_MULTI = "bfcl-multi"
AGENT_SOURCES = frozenset({AGENT_SOURCE, AGENT_AUTO})
PARALLEL_CATEGORIES = frozenset(c for c in SUPPORTED_CATEGORIES if "parallel" in c)


@dataclass(frozen=True)
class AutoCase:
    """A case of the `auto` dataset: a BFCL question or an agent scenario asked with
    `tool_choice: auto` (the model chooses between a text answer and a call)."""

    inner: BfclCase | AgentCase

    @property
    def id(self) -> str:  # apart from the same question asked in forced mode in one run
        return f"{self.inner.id}@auto"

    @property
    def category(self) -> str:
        return self.inner.category

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.inner.messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.inner.tools


Case = BfclCase | AgentCase | AutoCase | MultiTurnStep


@dataclass(frozen=True)
class DatasetSpec:
    source: str
    category: str

    def __str__(self) -> str:
        return f"{self.source}:{self.category}"


@dataclass(frozen=True)
class DatasetSource:
    """A source `--dataset` accepts: `name:<category>`, or `name` alone when it has no
    categories (a whole set). `--help` lists them from `DATASETS`."""

    name: str
    description: str
    categories: tuple[str, ...] = ()


DATASETS: dict[str, DatasetSource] = {}


def register_dataset(name: str, description: str,
                     categories: Iterable[str] = ()) -> DatasetSource:
    """Add (or replace) a dataset source; `--dataset` and `--help` then know it (loading its
    cases is `load_cases`'s job)."""
    source = DatasetSource(name, description, tuple(categories))
    DATASETS[name] = source
    return source


register_dataset("bfcl", "BFCL v4 single-turn questions, tool_choice required",
                 SUPPORTED_CATEGORIES)
register_dataset(AGENT_SOURCE, "the multi-turn agent scenarios on the server's demo and bench "
                 "tools (app/datasets/agent_scenarios.py)")
register_dataset(BFCL_AUTO, "the BFCL questions with tool_choice auto (the model may answer "
                 "in text)", SUPPORTED_CATEGORIES)
register_dataset(AGENT_AUTO, "the agent scenarios with tool_choice auto")
register_dataset(BFCL_MULTI, "BFCL's multi-turn conversations replayed call by call "
                 "(load_tests/bfcl_multi.py; needs an 8,192-token context, configs/bench.yaml; "
                 "--limit counts conversations)", MULTI_CATEGORIES)
DATASET_SOURCES = tuple(DATASETS)
# Shorthands for several categories at once.
BFCL_GROUPS: dict[str, tuple[str, ...]] = {"core": CORE_CATEGORIES}
# `auto`: the questions of the `auto` dataset.
AUTO_SET = (f"{BFCL_AUTO}:simple_python", f"{BFCL_AUTO}:multiple", AGENT_AUTO)


def parse_dataset_spec(spec: str) -> list[DatasetSpec]:
    """`"bfcl:simple_python,multiple"` or `"bfcl:simple_python,bfcl:parallel"` -> specs.

    An item without `source:` takes the source of the item before it; `bfcl:core` means the
    four core categories; `agent` is the whole agent scenario set; `bfcl-auto:<category>` and
    `agent-auto` the same with `tool_choice: auto`, and `auto` both (`AUTO_SET`);
    `bfcl-multi:<category>` BFCL's multi-turn conversations. Duplicates are dropped, order
    kept.
    """
    out: list[DatasetSpec] = []
    source: str | None = None
    items = [i for raw in spec.split(",")
             for i in (AUTO_SET if raw.strip() == "auto" else (raw,))]
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        agent = item.removesuffix(":all")
        if agent in AGENT_SOURCES:
            source = agent
            if DatasetSpec(agent, "all") not in out:
                out.append(DatasetSpec(agent, "all"))
            continue
        if ":" in item:
            source, _, category = item.partition(":")
            source, category = source.strip(), category.strip()
        else:
            category = item
        if source is None:
            raise ValueError(f"dataset {item!r} has no source; write e.g. bfcl:{item}")
        if source not in DATASETS:
            raise ValueError(
                f"unknown dataset source {source!r}; known: {', '.join(DATASETS)}"
            )
        if source in AGENT_SOURCES:
            raise ValueError(f"the agent set has no category {category!r}; write just "
                             f"'{source}'")
        if source == BFCL_MULTI:
            if category not in MULTI_CATEGORIES:
                raise ValueError(f"BFCL multi-turn category {category!r} is not supported; "
                                 f"use one of {', '.join(MULTI_CATEGORIES)}")
            if DatasetSpec(source, category) not in out:
                out.append(DatasetSpec(source, category))
            continue
        categories = BFCL_GROUPS.get(category, (category,))
        for name in categories:
            if name not in DATASETS[source].categories:
                raise ValueError(
                    f"{source} category {name!r} is not supported; use one of "
                    + ", ".join((*DATASETS[source].categories, *BFCL_GROUPS))
                )
            entry = DatasetSpec(source, name)
            if entry not in out:
                out.append(entry)
    if not out:
        raise ValueError("no dataset given")
    return out


def load_cases(
    specs: Iterable[DatasetSpec],
    limit: int | None,
    server_tools: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    conversations: int | None = None,
) -> list[Case]:
    """Cases of every spec, in order. The agent set takes its tool definitions from the
    server (`server_tools()`: the `data` of `GET /v1/tools`), so it needs that callable.
    `conversations` bounds the bfcl-multi sets (default: `limit`)."""
    from app.datasets.agent_scenarios import load_agent_cases

    cases: list[Case] = []
    for spec in specs:
        loaded: list[BfclCase] | list[AgentCase]
        if spec.source == BFCL_MULTI:
            cases += load_bfcl_multi(spec.category,
                                     conversations if conversations is not None else limit)
            continue
        if spec.source in AGENT_SOURCES:
            if server_tools is None:
                raise ValueError("the agent set needs the server's tool listing")
            loaded = load_agent_cases(server_tools(), limit)
        else:
            loaded = load_bfcl(spec.category, limit)
        if spec.source in (BFCL_AUTO, AGENT_AUTO):
            cases += [AutoCase(c) for c in loaded]
        else:
            cases += loaded
    return cases


def case_source(case: Case) -> str:
    if isinstance(case, MultiTurnStep):
        return BFCL_MULTI
    if isinstance(case, AutoCase):
        return AGENT_AUTO if isinstance(case.inner, AgentCase) else BFCL_AUTO
    return AGENT_SOURCE if isinstance(case, AgentCase) else "bfcl"
