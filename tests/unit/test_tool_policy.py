"""Pre-execution policy and reconciliation (app.tools.policy): the safety properties."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.speculation.canonical import Invocation, canonical_invocation
from app.tools.policy import PreExecutionLedger, may_pre_execute
from app.tools.registry import ToolResult, ToolSpec

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "default": 0},
        "y": {"type": "string", "enum": ["p", "q"]},
    },
    "additionalProperties": False,
}


def spec(
    name: str,
    *,
    idempotent: bool = True,
    speculate: str | None = None,
    egress: bool = False,
) -> ToolSpec:
    return ToolSpec(
        name=name,
        parameters=PARAMETERS,
        idempotent=idempotent,
        speculate=speculate or ("always" if idempotent else "never"),  # type: ignore[arg-type]
        timeout_s=1.0,
        source="python",
        egress=egress,
    )


def call(name: str, **arguments: Any) -> Invocation:
    return Invocation(name=name, arguments=arguments)


def result_for(invocation: Invocation, *, is_error: bool = False) -> ToolResult:
    # The content records exactly what ran, so tests can check what answered what.
    key = canonical_invocation(invocation, PARAMETERS)
    return ToolResult(name=invocation.name, content=key, is_error=is_error, latency_ms=1.0)


TOOLS = {
    "lookup": spec("lookup"),
    "lookup_never": spec("lookup_never", speculate="never"),
    "append": spec("append", idempotent=False),
    "fetch_remote": spec("fetch_remote", egress=True),
}


# -- may_pre_execute -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "enabled", "egress_ok", "expected"),
    [
        (TOOLS["lookup"], True, False, True),
        (TOOLS["lookup"], False, True, False),  # global switch off
        (None, True, True, False),  # not server-known
        (TOOLS["append"], True, True, False),  # not idempotent
        (TOOLS["lookup_never"], True, True, False),  # idempotent but speculate: never
        (TOOLS["fetch_remote"], True, False, False),  # egress not allowed
        (TOOLS["fetch_remote"], True, True, True),
    ],
)
def test_may_pre_execute(
    tool: ToolSpec | None, enabled: bool, egress_ok: bool, expected: bool
) -> None:
    assert may_pre_execute(tool, enabled, egress_ok) is expected


# -- the ledger ------------------------------------------------------------------------------


def test_start_dedups_canonically_and_refuses_what_policy_forbids() -> None:
    ledger = PreExecutionLedger(TOOLS)
    assert ledger.start(call("lookup", x=1, y="p"))
    assert not ledger.start(call("lookup", y="p", x=1.0))  # same canonical call
    assert ledger.start(call("lookup", x=2, y="p"))
    assert not ledger.start(call("append", x=1))
    assert not ledger.start(call("lookup_never", x=1))
    assert not ledger.start(call("fetch_remote", x=1))
    assert not ledger.start(call("unknown_tool"))
    assert not PreExecutionLedger(TOOLS, global_enabled=False).start(call("lookup"))
    assert PreExecutionLedger(TOOLS, allow_egress=True).start(call("fetch_remote"))


def test_take_needs_canonical_equality_with_defaults_filled() -> None:
    ledger = PreExecutionLedger(TOOLS)
    predicted = call("lookup", y="q")  # x omitted: the schema default 0 applies
    assert ledger.start(predicted)
    assert ledger.is_pending(predicted)
    assert ledger.take(predicted) is None  # nothing recorded yet
    ledger.record(predicted, result_for(predicted))
    assert not ledger.is_pending(predicted)
    assert ledger.take(call("lookup", x=0, y="p")) is None  # different argument
    assert ledger.take(call("lookup_never", x=0, y="q")) is None  # different tool
    taken = ledger.take(call("lookup", x=0.0, y="q"))
    assert taken is not None and taken.content == canonical_invocation(predicted, PARAMETERS)
    assert ledger.take(call("lookup", x=0, y="q")) is None  # one result answers one call


def test_error_results_are_not_reused() -> None:
    ledger = PreExecutionLedger(TOOLS)
    predicted = call("lookup", x=5)
    ledger.start(predicted)
    ledger.record(predicted, result_for(predicted, is_error=True))
    assert ledger.take(predicted) is None


def test_record_without_start_is_a_bug() -> None:
    with pytest.raises(KeyError):
        PreExecutionLedger(TOOLS).record(call("lookup"), result_for(call("lookup")))


# -- the simulator: pre-execution ‖ main model commit ---------------------------------------

TOOL_NAMES = ["t0", "t1", "t2", "unknown"]


@st.composite
def tool_sets(draw: st.DrawFn) -> dict[str, ToolSpec]:
    # t0 is always pre-executable (so hits are common); t1 and t2 get random flags.
    tools = {"t0": spec("t0")}
    for name in ("t1", "t2"):
        idempotent = draw(st.booleans())
        speculate = draw(st.sampled_from(["always", "never"])) if idempotent else "never"
        tools[name] = spec(
            name, idempotent=idempotent, speculate=speculate, egress=draw(st.booleans())
        )
    return tools  # "unknown" is never registered


# Few distinct values, so predictions and commits collide often; x as int or equal float and
# an omitted x (default 0) exercise canonical equality.
invocations = st.builds(
    lambda name, x, y: Invocation(
        name=name,
        arguments={k: v for k, v in (("x", x), ("y", y)) if v is not None},
    ),
    st.sampled_from(TOOL_NAMES),
    st.one_of(st.none(), st.sampled_from([0, 1, 1.0, 2])),
    st.one_of(st.none(), st.sampled_from(["p", "q"])),
)


class Answer(NamedTuple):
    """One committed call with the result that answers it."""

    invocation: Invocation
    result: ToolResult
    speculative: bool  # True when `result` came from pre-execution


def reusable(tool: ToolSpec | None) -> bool:
    return tool is not None and tool.idempotent and tool.speculate == "always"


def oracle_key(invocation: Invocation) -> str:
    # Independent of the code under test: every registered tool here shares PARAMETERS.
    return canonical_invocation(invocation, PARAMETERS)


@settings(max_examples=600, deadline=None)
@given(
    tools=tool_sets(),
    enabled=st.booleans(),
    allow_egress=st.booleans(),
    candidates=st.lists(st.tuples(invocations, st.booleans()), max_size=5),
    fresh_commits=st.lists(invocations, max_size=4),
    echoed=st.lists(st.integers(0, 4), max_size=5),
    variants=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([None, 0, 0.0, 1, 1.0, 2])), max_size=3
    ),
)
def test_simulated_requests_keep_the_safety_properties(
    tools: dict[str, ToolSpec],
    enabled: bool,
    allow_egress: bool,
    candidates: list[tuple[Invocation, bool]],
    fresh_commits: list[Invocation],
    echoed: list[int],
    variants: list[tuple[int, int | float | None]],
) -> None:
    """Random tools, predictions (some of whose runs fail) and commits (echoes of predictions,
    near misses, unrelated calls): the policy and the ledger keep every safety property."""
    committed = [candidates[i][0] for i in echoed if i < len(candidates)] + fresh_commits
    # Near misses: a prediction with `x` changed, dropped (default 0) or written as a float.
    for index, x in variants:
        if index < len(candidates):
            base = candidates[index][0]
            arguments = {k: v for k, v in base.arguments.items() if k != "x"}
            committed.append(
                Invocation(
                    name=base.name, arguments=arguments | ({"x": x} if x is not None else {})
                )
            )
    executions: list[tuple[str, Invocation]] = []  # (phase, call): every real execution

    # Phase 1, while the main model decodes: predictions start tools only through the policy.
    ledger = PreExecutionLedger(tools, global_enabled=enabled, allow_egress=allow_egress)
    succeeded: Counter[str] = Counter()
    for candidate, fails in candidates:
        if may_pre_execute(tools.get(candidate.name), enabled, allow_egress) and ledger.start(
            candidate
        ):
            executions.append(("pre", candidate))
            ledger.record(candidate, result_for(candidate, is_error=fails))
            succeeded[oracle_key(candidate)] += 0 if fails else 1

    # Phase 2, after the commit: each committed call gets a pre-executed result or runs now.
    answers: list[Answer] = []
    for commit in committed:
        taken = ledger.take(commit)
        if taken is None:
            executions.append(("post", commit))
            answers.append(Answer(commit, result_for(commit), False))
        else:
            answers.append(Answer(commit, taken, True))

    # 1. A tool that is not idempotent, not speculable, or not server-known never runs early,
    #    and runs exactly as often as the main model committed it: no more, no fewer.
    unsafe_runs = [(p, c) for p, c in executions if not reusable(tools.get(c.name))]
    assert all(phase == "post" for phase, _ in unsafe_runs)
    assert Counter(oracle_key(c) for _, c in unsafe_runs) == Counter(
        oracle_key(c) for c in committed if not reusable(tools.get(c.name))
    )
    # 2. Nothing runs early unless the rules allow it (restated here, not via the code under
    #    test), and nothing twice.
    early = [c for phase, c in executions if phase == "pre"]
    for c in early:
        tool = tools.get(c.name)
        assert enabled and tool is not None and reusable(tool)
        assert allow_egress or not tool.egress
    assert len({oracle_key(c) for c in early}) == len(early)
    # 3. Every committed call gets exactly one answer; a pre-executed answer is the successful
    #    result of a canonically equal call, each used once; and one is used whenever it can be
    #    (an exact oracle, walking the commits in order).
    assert [a.invocation for a in answers] == committed
    available = Counter(succeeded)
    for answer in answers:
        k = oracle_key(answer.invocation)
        if reusable(tools.get(answer.invocation.name)) and available[k] > 0:
            available[k] -= 1
            assert answer.speculative
            assert answer.result is not None and not answer.result.is_error
            assert answer.result.content == k
        else:
            assert not answer.speculative
