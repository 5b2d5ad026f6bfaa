"""BFCL v4 multi-turn conversations, replayed step by step as OpenAI chat requests.

A BFCL multi-turn case is a conversation of user turns against stateful tool classes
(`GorillaFileSystem`, `TradingBot`, ...), with the ground-truth calls of each turn. The replay
makes one request per ground-truth call: it holds the conversation so far (the user turns, the
earlier ground-truth calls as assistant `tool_calls`, and their results), the tools of the
classes involved, and expects that call. The results come from executing the earlier calls
with BFCL's own classes, loaded from the case's `initial_config`, as BFCL's checker does
(`multi_turn_utils.execute_multi_turn_func_call`). Every request is built before any is sent,
from the ground truth alone, so every decoding mode sees exactly the same requests: contexts
never drift between modes.

The classes ship in the same `bfcl-eval` wheel as the data (`bfcl_eval/eval_checker/
multi_turn_eval/func_source_code/`); load_tests/bfcl.py explains why the wheel is never
installed. Their modules import only the standard library (and `mpmath`, which torch brings),
so they are imported straight from the wheel. Calls run as method calls with keyword
arguments parsed from the ground-truth strings (`ast.literal_eval` on each argument), never
through `eval`.

A turn's calls are followed directly by the next user turn: BFCL's ground truth has no text
answers, and inventing one would put words in the model's mouth.

Scoring (`score_step`): the response must make exactly the expected call; an argument the
ground truth leaves out may be absent or equal to the method's default.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from load_tests.bfcl import bfcl_wheel, to_openai_tools

# The multi-turn categories replayed. The others need what a replay of the ground truth
# cannot give: `miss_func`/`miss_param` have turns whose right answer is a question back,
# `long_context` floods the results past this model's context.
MULTI_CATEGORIES = ("multi_turn_base",)

_DATA_DIR = "bfcl_eval/data"
_BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# Class -> module under _BACKEND and function-doc file (BFCL's executable_backend_config).
CLASS_MODULES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
# Classes BFCL starts without a scenario.
STATELESS_CLASSES = frozenset({"MathAPI"})


class ExpectedCall(BaseModel):
    """One ground-truth call: the method, its arguments by name, and the method's defaults for
    the parameters the ground truth leaves out."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any]
    defaults: dict[str, Any] = {}


class MultiTurnStep(BaseModel):
    """One request of a replayed conversation: the context before ground-truth call `index`."""

    model_config = ConfigDict(frozen=True)

    id: str  # "<conversation>#<index>"
    category: str
    conversation: str  # BFCL's case id
    index: int  # position of the call in the conversation (0 = its first call)
    turn: int  # the user turn the call answers
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    expected: ExpectedCall


class Conversation(BaseModel):
    """A BFCL multi-turn case as the replay reads it."""

    model_config = ConfigDict(frozen=True)

    id: str
    category: str
    turns: list[list[dict[str, Any]]]  # each user turn's messages
    calls: list[list[str]]  # each turn's ground-truth calls, as BFCL writes them
    involved_classes: list[str]
    initial_config: dict[str, Any]


# ---------------------------------------------------------------- loading


def load_conversations(
    category: str, limit: int | None = None, wheel: Path | None = None
) -> list[Conversation]:
    """The first `limit` conversations of a multi-turn category, in file order."""
    _check_category(category)
    with zipfile.ZipFile(wheel or bfcl_wheel()) as archive:
        questions = _read_jsonl(archive, f"{_DATA_DIR}/BFCL_v4_{category}.json")
        answers = {
            row["id"]: row["ground_truth"]
            for row in _read_jsonl(archive, f"{_DATA_DIR}/possible_answer/BFCL_v4_{category}.json")
        }
    if limit is not None:
        questions = questions[:limit]
    return [
        Conversation(
            id=row["id"],
            category=category,
            turns=row["question"],
            calls=answers[row["id"]],
            involved_classes=row["involved_classes"],
            initial_config=row.get("initial_config") or {},
        )
        for row in questions
    ]


def load_bfcl_multi(
    category: str, limit: int | None = None, wheel: Path | None = None
) -> list[MultiTurnStep]:
    """Every step of the first `limit` conversations (`limit` counts conversations)."""
    path = wheel or bfcl_wheel()
    docs = function_docs(path)
    steps: list[MultiTurnStep] = []
    for conversation in load_conversations(category, limit, path):
        steps += replay(conversation, docs, path)
    return steps


def function_docs(wheel: Path) -> dict[str, list[dict[str, Any]]]:
    """Class -> BFCL function docs (`multi_turn_func_doc/<module>.json`)."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            cls: _read_jsonl(archive, f"{_DATA_DIR}/multi_turn_func_doc/{module}.json")
            for cls, module in CLASS_MODULES.items()
        }


def _check_category(category: str) -> None:
    if category not in MULTI_CATEGORIES:
        raise ValueError(
            f"BFCL multi-turn category {category!r} is not supported; use one of "
            + ", ".join(MULTI_CATEGORIES)
        )


def _read_jsonl(archive: zipfile.ZipFile, member: str) -> list[dict[str, Any]]:
    text = archive.read(member).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- the replay


def replay(
    conversation: Conversation, docs: Mapping[str, list[dict[str, Any]]], wheel: Path
) -> list[MultiTurnStep]:
    """The conversation's requests, one per ground-truth call, with the results of executing
    the earlier calls on fresh instances of its classes."""
    unknown = [c for c in conversation.involved_classes if c not in CLASS_MODULES]
    if unknown:
        raise ValueError(f"{conversation.id}: no executable class for {unknown}")
    instances = start_instances(conversation, wheel)
    functions = [doc for cls in conversation.involved_classes for doc in docs[cls]]
    tools, _, _ = to_openai_tools(functions)
    methods = {name: method for instance in instances.values()
               for name, method in public_methods(instance).items()}
    messages: list[dict[str, Any]] = []
    steps: list[MultiTurnStep] = []
    for turn, (user_messages, calls) in enumerate(
        zip(conversation.turns, conversation.calls, strict=True)
    ):
        messages += [dict(m) for m in user_messages]
        for text in calls:
            expected = parse_call(text, methods)
            index = len(steps)
            steps.append(MultiTurnStep(
                id=f"{conversation.id}#{index}", category=conversation.category,
                conversation=conversation.id, index=index, turn=turn,
                messages=copy.deepcopy(messages), tools=tools, expected=expected,
            ))
            call_id = f"call_{index}"
            messages.append({
                "role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {
                    "name": expected.name,
                    "arguments": json.dumps(expected.arguments, ensure_ascii=False)}}],
            })
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": execute(methods[expected.name], expected.arguments)})
    return steps


def start_instances(conversation: Conversation, wheel: Path) -> dict[str, Any]:
    """Fresh instances of the conversation's classes, each loaded with its `initial_config`
    (deep-copied, as BFCL does: the classes mutate it)."""
    instances: dict[str, Any] = {}
    for cls in conversation.involved_classes:
        instance = getattr(backend_module(CLASS_MODULES[cls], wheel), cls)()
        if cls not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(conversation.initial_config.get(cls, {})),
                                    long_context=False)
        instances[cls] = instance
    return instances


def backend_module(name: str, wheel: Path) -> Any:
    """`bfcl_eval...func_source_code.<name>`, imported from the wheel (a zip on sys.path; an
    installed bfcl_eval, earlier on the path, would win)."""
    if str(wheel) not in sys.path:
        sys.path.append(str(wheel))
    return importlib.import_module(f"{_BACKEND}.{name}")


def public_methods(instance: Any) -> dict[str, Any]:
    return {name: method for name, method in inspect.getmembers(instance, inspect.ismethod)
            if not name.startswith("_")}


def parse_call(text: str, methods: Mapping[str, Any]) -> ExpectedCall:
    """`"mv(source='a', destination='b')"` -> ExpectedCall; positional arguments are named from
    the method's signature, tuples become lists (what JSON carries)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    if name not in methods:
        raise ValueError(f"{text!r} calls {name!r}, which none of the classes has")
    signature = inspect.signature(methods[name])
    positional = [_json_value(ast.literal_eval(arg)) for arg in node.args]
    keywords = {kw.arg: _json_value(ast.literal_eval(kw.value)) for kw in node.keywords
                if kw.arg is not None}
    bound = signature.bind(*positional, **keywords)
    defaults = {
        p.name: _json_value(p.default) for p in signature.parameters.values()
        if p.name not in bound.arguments and p.default is not inspect.Parameter.empty
    }
    return ExpectedCall(name=name, arguments=dict(bound.arguments), defaults=defaults)


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def execute(method: Any, arguments: Mapping[str, Any]) -> str:
    """One call's result as BFCL's executor writes it: a string as is, a dict as JSON (its
    `str` when it does not serialise), anything else by `str`; a raised error as
    `Error during execution: ...`."""
    try:
        result = method(**copy.deepcopy(dict(arguments)))
    except Exception as exc:  # noqa: BLE001 - BFCL hands errors to the model as results
        return f"Error during execution: {exc}"
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


# ---------------------------------------------------------------- scoring


def score_step(calls: Sequence[Mapping[str, str]], step: MultiTurnStep) -> bool:
    """Whether the response made exactly the expected call (arguments as JSON text)."""
    if len(calls) != 1 or calls[0]["name"] != step.expected.name:
        return False
    try:
        arguments = json.loads(calls[0]["arguments"] or "{}")
    except (TypeError, ValueError):
        return False
    if not isinstance(arguments, dict):
        return False
    expected, defaults = step.expected.arguments, step.expected.defaults
    if any(k not in expected and k not in defaults for k in arguments):
        return False
    names = set(expected) | set(arguments)
    missing = object()
    return all(
        _same(arguments.get(k, defaults.get(k, missing)), expected.get(k, defaults.get(k)))
        for k in names
    )


def _same(value: Any, expected: Any) -> bool:
    # JSON numbers compare by value (5.0 is 5), but a bool is not a number.
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return bool(value == expected)
