"""`tool_choice: auto` drafting (app/drafting/auto_drafts.py): when drafts are active, where a
call opens in each format, how candidates are rendered, and the proposer driven by the gate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.config import AppConfig
from app.drafting.auto_drafts import AutoDrafts, Phase, phase
from app.formats.reasoning import Reasoning
from app.formats.tool_format import SchemaDraft
from app.formats.tool_formats import ParsedCall, get_format
from app.main_model.service import MainModelService, PreparedRequest
from app.openai_models import ChatCompletionRequest
from tests.unit.test_candidate_proposer import Batch, decode, encode

HERMES = get_format("hermes")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
PARIS = [ParsedCall("get_weather", {"city": "Paris"})]
CALL = HERMES.render(PARIS)  # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
SCHEMA_TEXT = HERMES.render([ParsedCall("get_weather", {"city": ""})])
SCHEMA = [SchemaDraft(SCHEMA_TEXT)]


# ----- the phase, from the text so far ---------------------------------------------------
@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_every_format_opens_diverges_and_calls(fmt: str) -> None:
    form = get_format(fmt)
    call = form.render(PARIS)
    assert phase("", form, None, [call]) == Phase("open", 0)
    assert phase(call[:1], form, None, [call]).kind in ("open", "call")
    assert phase(call, form, None, [call]).kind == "call"
    assert phase("The weather is", form, None, [call]) == Phase("diverged", 0)
    assert phase("", form, None, []) == Phase("diverged", 0)  # nothing predicted (yet)


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_a_call_after_text_is_anchored_at_its_marker(fmt: str) -> None:
    form = get_format(fmt)
    call = form.render(PARIS)
    text = "Let me check that.\n" + call[:14]
    assert phase(text, form, None, [call]) == Phase("call", len("Let me check that.\n"))


def test_pythonic_calls_only_open_at_the_start() -> None:
    """As vLLM's pythonic parser: a list after text is content, never a call."""
    form = get_format("pythonic")
    assert phase("See [get_weather(city='Paris')]", form, None, []).kind == "diverged"


def test_leading_whitespace_is_skipped_and_anchors_the_candidates() -> None:
    assert phase("\n\n<tool", HERMES, None, [CALL]) == Phase("open", 2)
    assert phase("\n\nHi", HERMES, None, [CALL]) == Phase("diverged", 2)


def test_thinking_waits_for_the_reasoning_to_close() -> None:
    qwen = Reasoning("qwen3")
    assert phase("<think>\nweather", HERMES, qwen, [CALL]) == Phase("thinking")
    closed = "<think>\nweather\n</think>"
    assert phase(closed, HERMES, qwen, [CALL]) == Phase("open", len(closed))
    assert phase(closed + "\n\nIt is", HERMES, qwen, [CALL]) == Phase("diverged",
                                                                      len(closed) + 2)
    # qwen3 may call without closing its thoughts: the call ends them and opens at once
    assert phase("hmm<tool_call>", HERMES, qwen, [CALL]) == Phase("call", 3)
    # deepseek_r1: a call inside unclosed thoughts is reasoning, never a call
    assert phase("<think>maybe " + CALL, HERMES, Reasoning("deepseek_r1"), [CALL]).kind == \
        "thinking"


# ----- the gate: candidates as the output grows ------------------------------------------
def test_predicted_calls_draft_from_the_first_token_schema_drafts_only_in_a_call() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    assert gate.candidates("") == []  # no prediction yet, and no call open
    gate.predicted([CALL])
    assert gate.candidates("") == [CALL]
    assert gate.candidates("<tool_") == [CALL]
    assert gate.candidates("<tool_call>\n{") == [CALL, SCHEMA_TEXT]


def test_a_text_answer_stops_drafting_and_stays_stopped() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    gate.predicted([CALL])
    answer = "Paris is the capital of France, and the weather there is"
    for end in range(1, len(answer) + 1):
        assert gate.candidates(answer[:end]) == [], answer[:end]
    gate.predicted([HERMES.render([ParsedCall("get_weather", {"city": "Rome"})])])
    assert gate.candidates(answer) == []  # a late prediction does not revive it


def test_a_call_after_text_drafts_behind_the_text_written() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    gate.predicted([CALL])
    text = "Sure, one moment.\n"
    assert gate.candidates(text) == []
    opened = gate.candidates(text + "<tool_call>")
    assert opened == [text + CALL, text + SCHEMA_TEXT]
    assert gate.candidates(text + '<tool_call>\n{"name"') is opened  # the proposer's list holds


def test_no_call_prediction_drafts_nothing_until_a_call_opens() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    gate.predicted([CALL])  # history's guess
    gate.no_call()  # the sidecar expects text
    assert gate.candidates("") == []
    assert gate.candidates("<tool") == []
    assert gate.candidates("<tool_call>") == [CALL, SCHEMA_TEXT]


def test_newer_predictions_come_first_and_reset_the_list() -> None:
    gate = AutoDrafts(HERMES, None, [])
    gate.predicted([CALL])
    first = gate.candidates("")
    rome = HERMES.render([ParsedCall("get_weather", {"city": "Rome"})])
    gate.predicted([rome, CALL])
    second = gate.candidates("")
    assert second == [rome, CALL] and second is not first


# ----- rendering (the main replica) ------------------------------------------------------
def _prepared(fmt: str, tool_choice: Any = "auto", **extra: Any) -> tuple[MainModelService,
                                                                           PreparedRequest]:
    config = AppConfig.model_validate({"main": {"engine": {"tool_format": fmt}}})
    main = MainModelService(config, engine=SimpleNamespace(speculation=object()))  # type: ignore[arg-type]
    request = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, TIME],
        "tool_choice": tool_choice, **extra})
    prepared = PreparedRequest(request, [1], {"max_tokens": 8}, request.effective_tool_choice,
                               request.tool_dicts(), True)
    return main, prepared


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_auto_schema_drafts_are_every_tool_in_the_format(fmt: str) -> None:
    main, prepared = _prepared(fmt)
    form = get_format(fmt)
    drafts = main.schema_candidates(prepared)
    texts = [d.text for d in drafts]
    expected = [*form.render_variants([ParsedCall("get_weather", {"city": ""})]),
                *form.render_variants([ParsedCall("get_time", {"zone": ""})])]
    assert texts == expected
    assert all(form.call_start(t) == 0 for t in texts)
    # One open value each (the city, the zone): the draft stops where it begins.
    calls = [ParsedCall("get_weather", {"city": "Paris"}), ParsedCall("get_time", {"zone": "UTC"})]
    for draft in drafts:
        [call] = [c for c in calls if c.name in draft.text]
        [stop] = draft.stops
        value = str(next(iter(call.arguments.values())))
        assert any(r.startswith(draft.text[:stop] + value)
                   for r in form.render_variants([call])), draft


def test_hermes_auto_candidates_are_tool_call_blocks() -> None:
    main, prepared = _prepared("hermes")
    assert main.render_candidate(prepared, PARIS) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>']


def test_only_speculative_auto_chat_requests_get_a_gate() -> None:
    main, auto = _prepared("hermes")
    assert main.auto_drafts(auto) is not None
    _, required = _prepared("hermes", "required")
    assert main.auto_drafts(required) is None
    _, with_format = _prepared("hermes", response_format={"type": "json_object"})
    assert main.auto_drafts(with_format) is None  # its output is JSON: no call opens
    auto.speculate = False
    assert main.auto_drafts(auto) is None


# ----- the proposer follows the gate -----------------------------------------------------
def _drafts(output: str, gate: AutoDrafts) -> list[str]:
    batch = Batch([encode(output)], k=8)
    assert batch.store.set_gate("r0", gate)
    texts = []
    while batch.done[0] < len(batch.outputs[0]):
        texts.append(decode(batch.step([1])[0]))
    return texts


def test_proposer_drafts_a_predicted_call_from_the_first_token() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    gate.predicted([CALL])
    drafts = _drafts(CALL, gate)
    assert all(drafts[:-1]), drafts  # every step before the end drafted


def test_proposer_drafts_nothing_in_a_text_answer_then_the_call() -> None:
    gate = AutoDrafts(HERMES, None, SCHEMA)
    gate.predicted([CALL])
    text = "I will look that up for you now.\n"
    drafts = _drafts(text + CALL, gate)
    steps_in_text = len(encode(text)) - 1
    assert not any(drafts[1:steps_in_text]), drafts  # the first token left the call
    assert sum(1 for d in drafts[steps_in_text:] if d) >= 10, drafts  # the call is drafted
