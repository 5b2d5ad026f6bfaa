"""The benchmark (`python -m load_tests.bench`, or `ooo-spec bench` from the repository root):
the same cases, several decoding modes, one server.

A *mode* is a name plus the request extras that select it: `plain` (`ooo_spec.enabled: false`,
the baseline), `ngram` (vLLM's own prompt-lookup speculation on the server's second main engine,
`ooo_spec.baseline: "ngram"`), `suffix` (vLLM's own suffix decoding on a further main engine,
`ooo_spec.baseline: "suffix"`; needs arctic-inference), `ooo` (sidecar candidates, no
pre-execution) and `ooo+tools`
(the same plus speculative pre-execution of server-known tools; only on the `agent` set, since
BFCL's tools are unknown to the server). Modes live in `MODES`; add one with `register_mode`.

Datasets: BFCL categories (`bfcl:simple_python,multiple,...`), the multi-turn agent scenario set
(`agent`, app/datasets/agent_scenarios.py), and BFCL's multi-turn conversations replayed call by
call (`bfcl-multi:multi_turn_base`, load_tests/bfcl_multi.py; `--limit` counts conversations),
reported per call, by position in the conversation and per conversation. The `auto` dataset asks
the same questions with `tool_choice: auto`, as agent frameworks do (`bfcl-auto:<category>`,
`agent-auto`; `auto` is `bfcl-auto:simple_python,multiple` and `agent-auto`): the model may
answer in text or call, and its cases are reported apart (`main passes / call` counts passes per
committed call). Agent requests run the server-side agent loop (`execute_tools: true`) in every
mode, so every mode pays for the same tool executions and only `ooo+tools` may start them early.

Requests are interleaved case by case: for each case every mode runs once, and the order of
the modes rotates from one case to the next, so no mode always goes first (cold caches, a
neighbour's load spike) or last. `--warmup N` requests per mode run before, and are kept in the
JSON output but left out of every statistic.

Each request is one `openai` client call (the real SDK, `extra_body` carrying `ooo_spec`); the
`ooo_spec` report is read from the parsed response's extra fields. "Time to the committed tool
call" is the server's `timings_ms.first_commit` (router clock, request arrival to the first
turn's parsed calls): non-streamed and streamed responses alike deliver the calls only once
they are parsed, and on the agent set the calls are never sent to the client at all.

A request either gives a `Record` with the server's numbers, or a `Record` with `error` set;
each has a timeout, and the run aborts after `max_consecutive_errors` failures in a row, when
`max_duration_s` is spent, or when a warm-up request is refused (4xx: a mode the server cannot
serve), so it always ends by itself.

The statistics (`summarize`) are pure functions of the records: `report.py` prints and plots
them.

One module per part (README.md): `modes.py`, `datasets.py`, `records.py`, `run.py`,
`summary.py`, `command.py` and `cli.py` (`main`); every name is re-exported here.
"""

from app.datasets.agent_scenarios import AgentCase
from load_tests.bench.cli import (
    build_parser,
    datasets_help,
    main,
    modes_help,
)
from load_tests.bench.command import (
    DEFAULT_BASE_URL,
    BenchError,
    format_header,
    run_command,
    served_model,
    server_tool_listing,
    suffix_refusal,
)
from load_tests.bench.datasets import (
    AGENT_AUTO,
    AGENT_SOURCE,
    AGENT_SOURCES,
    AUTO_SET,
    BFCL_AUTO,
    BFCL_GROUPS,
    BFCL_MULTI,
    DATASET_SOURCES,
    DATASETS,
    PARALLEL_CATEGORIES,
    AutoCase,
    Case,
    DatasetSource,
    DatasetSpec,
    case_source,
    load_cases,
    parse_dataset_spec,
    register_dataset,
)
from load_tests.bench.modes import (
    BASELINE,
    DRAFTS,
    MODES,
    PEER,
    PEERS,
    SIDECAR,
    SIDECAR_BASE,
    SIDECAR_VERIFY,
    SUFFIX,
    Mode,
    mode_order,
    parse_modes,
    register_mode,
)
from load_tests.bench.records import (
    Record,
    RequestSettings,
    build_request,
    describe_error,
    mark_agreement,
    mark_identity,
    record_from_response,
    same_calls,
    score_output,
)
from load_tests.bench.run import (
    BenchAborted,
    PlanItem,
    RunLimits,
    build_plan,
    run_bench,
)
from load_tests.bench.summary import (
    conversation_totals,
    median,
    mode_summary,
    multi_turn_summary,
    paired_ratio_median,
    percentile,
    ratio,
    realign_effect,
    records_as_dicts,
    share,
    source_totals,
    summarize,
    summarize_by_source,
    versus_baseline,
)

__all__ = [
    "AGENT_AUTO",
    "AGENT_SOURCE",
    "AGENT_SOURCES",
    "AUTO_SET",
    "AgentCase",
    "AutoCase",
    "BASELINE",
    "BFCL_AUTO",
    "BFCL_GROUPS",
    "BFCL_MULTI",
    "BenchAborted",
    "BenchError",
    "Case",
    "DATASETS",
    "DATASET_SOURCES",
    "DEFAULT_BASE_URL",
    "DRAFTS",
    "DatasetSource",
    "DatasetSpec",
    "MODES",
    "Mode",
    "PARALLEL_CATEGORIES",
    "PEER",
    "PEERS",
    "PlanItem",
    "Record",
    "RequestSettings",
    "RunLimits",
    "SIDECAR",
    "SIDECAR_BASE",
    "SIDECAR_VERIFY",
    "SUFFIX",
    "build_parser",
    "build_plan",
    "build_request",
    "case_source",
    "conversation_totals",
    "datasets_help",
    "describe_error",
    "format_header",
    "load_cases",
    "main",
    "mark_agreement",
    "mark_identity",
    "median",
    "mode_order",
    "mode_summary",
    "modes_help",
    "multi_turn_summary",
    "paired_ratio_median",
    "parse_dataset_spec",
    "parse_modes",
    "percentile",
    "ratio",
    "realign_effect",
    "record_from_response",
    "records_as_dicts",
    "register_dataset",
    "register_mode",
    "run_bench",
    "run_command",
    "same_calls",
    "score_output",
    "served_model",
    "server_tool_listing",
    "share",
    "source_totals",
    "suffix_refusal",
    "summarize",
    "summarize_by_source",
    "versus_baseline",
]
