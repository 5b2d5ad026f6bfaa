"""BFCL multi-turn replay (load_tests.bfcl_multi): a small conversation built here, executed
with BFCL's own GorillaFileSystem from the bfcl-eval wheel (downloaded into the dataset cache
on first use, as tests/unit/test_bfcl_loader.py), then the shipped `multi_turn_base` set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_tests.bfcl import bfcl_wheel
from load_tests.bfcl_multi import (
    Conversation,
    MultiTurnStep,
    function_docs,
    load_bfcl_multi,
    load_conversations,
    parse_call,
    replay,
    score_step,
    start_instances,
)


@pytest.fixture(scope="module")
def wheel() -> Path:
    return bfcl_wheel()


def small_conversation() -> Conversation:
    files = {"notes.txt": {"type": "file", "content": "b line\na line"},
             "old": {"type": "directory", "contents": {}}}
    return Conversation(
        id="mine_0", category="multi_turn_base",
        turns=[[{"role": "user", "content": "Go into work and sort notes.txt."}],
               [{"role": "user", "content": "Now move it into old and list old."}]],
        # A positional argument (BFCL writes some), and a call that fails (no such file).
        calls=[["cd(folder='work')", "sort('notes.txt')"],
               ["mv(source='notes.txt', destination='old')", "cat(file_name='missing.txt')"]],
        involved_classes=["GorillaFileSystem"],
        # BFCL's layout: the root's one entry is the starting directory.
        initial_config={"GorillaFileSystem": {"root": {"home": {
            "type": "directory", "contents": {"work": {"type": "directory",
                                                        "contents": files}}}}}},
    )


def test_replay_holds_the_conversation_so_far_with_real_results(wheel: Path) -> None:
    conversation = small_conversation()
    steps = replay(conversation, function_docs(wheel), wheel)
    assert [(s.id, s.index, s.turn) for s in steps] == [
        ("mine_0#0", 0, 0), ("mine_0#1", 1, 0), ("mine_0#2", 2, 1), ("mine_0#3", 3, 1)]
    assert [s.expected.name for s in steps] == ["cd", "sort", "mv", "cat"]
    # Positional arguments are named from BFCL's method.
    assert steps[1].expected.arguments == {"file_name": "notes.txt"}
    first, last = steps[0], steps[3]
    assert first.messages == conversation.turns[0]
    roles = [m["role"] for m in last.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "user", "assistant",
                     "tool"]
    calls = [m["tool_calls"][0] for m in last.messages if m["role"] == "assistant"]
    assert [c["function"]["name"] for c in calls] == ["cd", "sort", "mv"]
    assert json.loads(calls[2]["function"]["arguments"]) == {"source": "notes.txt",
                                                              "destination": "old"}
    results = [m for m in last.messages if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    # The results are the class's own: the directory changed, the file came back sorted.
    assert json.loads(results[0]["content"]) == {"current_working_directory": "work"}
    assert json.loads(results[1]["content"]) == {"sorted_content": "a line\nb line"}
    # Every step offers the class's tools, as OpenAI functions.
    names = {t["function"]["name"] for t in first.tools}
    assert {"cd", "sort", "mv", "cat", "ls"} <= names
    assert all(t["function"]["parameters"]["type"] == "object" for t in first.tools)


def test_a_failing_call_becomes_bfcls_error_text_and_later_state_follows(wheel: Path) -> None:
    conversation = small_conversation().model_copy(update={"calls": [
        ["cd(folder='work')", "cat(file_name='missing.txt')", "ls()"], []]})
    steps = replay(conversation, function_docs(wheel), wheel)
    results = [m["content"] for m in steps[2].messages if m["role"] == "tool"]
    assert "missing.txt" in results[1] and "No such file" in results[1]
    assert [s.turn for s in steps] == [0, 0, 0]


def test_every_mode_sees_the_same_requests_and_instances_start_fresh(wheel: Path) -> None:
    conversation = small_conversation()
    docs = function_docs(wheel)
    assert replay(conversation, docs, wheel) == replay(conversation, docs, wheel)
    # The classes mutate their config: the conversation's own copy stays as loaded.
    files = start_instances(conversation, wheel)["GorillaFileSystem"]
    files.cd(folder="work")
    files.mv(source="notes.txt", destination="old")
    home = conversation.initial_config["GorillaFileSystem"]["root"]["home"]
    assert "notes.txt" in home["contents"]["work"]["contents"]
    again = start_instances(conversation, wheel)["GorillaFileSystem"]
    again.cd(folder="work")
    assert "notes.txt" in again.ls()["current_directory_content"]


def test_score_step_wants_exactly_the_expected_call(wheel: Path) -> None:
    methods = {"tail": start_instances(small_conversation(), wheel)["GorillaFileSystem"].tail}
    expected = parse_call("tail(file_name='log.txt', lines=20)", methods)
    step = MultiTurnStep(id="x#0", category="multi_turn_base", conversation="x", index=0,
                         turn=0, messages=[], tools=[], expected=expected)

    def call(name: str, arguments: str) -> list[dict[str, str]]:
        return [{"name": name, "arguments": arguments}]

    assert score_step(call("tail", '{"file_name": "log.txt", "lines": 20}'), step)
    assert score_step(call("tail", '{"lines": 20.0, "file_name": "log.txt"}'), step)
    assert not score_step(call("tail", '{"file_name": "log.txt", "lines": 10}'), step)
    assert not score_step(call("tail", '{"file_name": "log.txt"}'), step)  # lines left out
    assert not score_step(call("cat", '{"file_name": "log.txt"}'), step)
    assert not score_step(call("tail", "not json"), step)
    assert not score_step(call("tail", '{"file_name": "log.txt", "lines": 20}') * 2, step)
    # A parameter the ground truth leaves out may be given at the method's default.
    default = parse_call("tail(file_name='log.txt')", methods)
    assert default.defaults == {"lines": 10}
    step = step.model_copy(update={"expected": default})
    assert score_step(call("tail", '{"file_name": "log.txt"}'), step)
    assert score_step(call("tail", '{"file_name": "log.txt", "lines": 10}'), step)
    assert not score_step(call("tail", '{"file_name": "log.txt", "lines": 3}'), step)
    assert not score_step(call("tail", '{"file_name": "log.txt", "extra": 1}'), step)


def test_parse_call_refuses_what_is_not_a_plain_call() -> None:
    with pytest.raises(ValueError, match="none of the classes"):
        parse_call("rm(path='/')", {})
    with pytest.raises(ValueError, match="plain function call"):
        parse_call("os.system('x')", {})


def test_shipped_multi_turn_base_replays_completely(wheel: Path) -> None:
    conversations = load_conversations("multi_turn_base", wheel=wheel)
    assert len(conversations) == 200
    steps = load_bfcl_multi("multi_turn_base", limit=30, wheel=wheel)
    assert len({s.conversation for s in steps}) == 30
    expected_calls = sum(len(turn) for c in conversations[:30] for turn in c.calls)
    assert len(steps) == expected_calls
    for step in steps:
        # Its own ground truth scores right; every call it names is offered as a tool.
        own = [{"name": step.expected.name, "arguments": json.dumps(step.expected.arguments)}]
        assert score_step(own, step), step.id
        assert step.expected.name in {t["function"]["name"] for t in step.tools}
        assert step.messages[-1]["role"] in ("user", "tool")
    with pytest.raises(ValueError, match="not supported"):
        load_bfcl_multi("multi_turn_miss_func", wheel=wheel)


def test_the_load_benchmark_replays_conversations_too(wheel: Path) -> None:
    from load_tests.concurrency import load_categories
    from load_tests.load_requests import request_body

    cases = load_categories("simple_python, bfcl-multi:multi_turn_base", 2)
    assert [c.category for c in cases[:2]] == ["simple_python"] * 2
    steps = [c for c in cases if isinstance(c, MultiTurnStep)]
    assert {s.conversation for s in steps} == {"multi_turn_base_0", "multi_turn_base_1"}
    assert len(cases) == 2 + len(steps)
    body = request_body(steps[3], "ooo", 64)
    assert body["messages"] == steps[3].messages and body["tools"] == steps[3].tools
    assert body["tool_choice"] == "required" and "parallel_tool_calls" not in body
