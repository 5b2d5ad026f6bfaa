"""`pythonic`: Llama 3.2 / Llama 4 (pythonic mode), ToolACE and other models that write calls
as a Python list of calls: `[get_weather(city='Paris'), add(a=1, b=2)]`.

The whole output is the list, or it is all content. vLLM: `PythonicToolParser`.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, ToolFormat
from app.formats.tool_formats.incremental import CallDelta, CallStream

# Llama 3.2's own pythonic tool prompt.
TOOL_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose.\nIf none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out. You should "
    "only return the function call in tools call sections.\n\nIf you decide to invoke any of "
    "the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, "
    "params_name2=params_value2...), func_name2(params)]\nYou SHOULD NOT include any other "
    "text in the response.\n\nHere is a list of functions in JSON format that you can "
    "invoke.\n\n{tools}\n"
)

# How vLLM's parser recognizes a call list before parsing it: `[`, a name starting with a
# letter, `(`, then `)` or a keyword argument whose name starts with a letter.
_LIST_START_RE = re.compile(r"\[[a-zA-Z]+\w*\((?:\)|[a-zA-Z]+\w*\s*=)")
_JSON_NAMES = {"null": None, "true": True, "false": False}


class PythonicFormat(ToolFormat):
    name = "pythonic"
    vllm_parser = "pythonic"
    start_marker = "["

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        listing = json.dumps([t["function"] for t in tools], ensure_ascii=False, indent=4)
        return TOOL_PROMPT.format(tools=listing)

    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        def one(call: ParsedCall) -> str:
            args = ", ".join(f"{k}={python_literal(v)}" for k, v in call.arguments.items())
            return f"{call.name}({args})"

        return "[" + ", ".join(one(c) for c in calls) + "]"

    def writes_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> bool:
        return re.search(r"\[\s*[a-zA-Z]\w*\(", text) is not None

    def call_start(self, text: str) -> int:
        return 0 if text.startswith("[") else -1

    def stream_content(self, text: str) -> tuple[str, bool]:
        """Like vLLM: an output that opens with `[` is a call list, any other is content."""
        return ("", True) if text.startswith("[") else (text, False)

    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        return PythonicCalls()

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        if not _LIST_START_RE.match(text):
            return ParsedOutput(content=text, calls=[])
        try:
            module = ast.parse(text)
            node = getattr(module.body[0], "value", None) if module.body else None
            if not isinstance(node, ast.List) or not node.elts:
                raise ValueError("not a list of calls")
            calls = [_call(e) for e in node.elts]
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return ParsedOutput(content=text, calls=[])
        return ParsedOutput(content=None, calls=calls)


def _call(node: ast.expr) -> ParsedCall:
    if not isinstance(node, ast.Call):
        raise ValueError("not a call")
    args: dict[str, Any] = {}
    for keyword in node.keywords:  # positional arguments are ignored, as in vLLM
        if keyword.arg is None:
            raise ValueError("**kwargs is not a literal")
        args[keyword.arg] = _value(keyword.value)
    return ParsedCall(_dotted_name(node.func), args)


def _dotted_name(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ValueError("not a call by name")
    return ".".join([node.id, *reversed(parts)])


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
        raise ValueError("not a JSON value")
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise ValueError("dict keys must be literals")
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        return {k: _value(v) for k, v in zip(keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise ValueError("not a literal")


def python_literal(value: Any) -> str:
    """`value` (JSON-shaped) as the Python literal a model writes."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    return repr(value)  # str, int, float, bool, None


# ----- streaming ----------------------------------------------------------------------
_NAME_RE = re.compile(r"[A-Za-z_][\w.]*\Z")


class PythonicCalls(CallStream):
    """`[f(a=1), g(b='x')]`: a call's name when its `(` is written, its arguments (as JSON)
    when its `)` is; strings are tracked so brackets inside them do not count."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = 0
        self.depth = 0
        self.quote: str | None = None  # the open string's quote (' " ''' \"\"\")
        self.escaped = False
        self.element = 0  # where the current list element starts
        self.index: int | None = None
        self.finished = False

    def feed(self, piece: str) -> list[CallDelta]:
        self.buffer += piece
        deltas: list[CallDelta] = []
        text = self.buffer
        while self.pos < len(text) and not self.finished:
            char = text[self.pos]
            if self.quote is not None:
                self._in_string(text)
                continue
            if char in "'\"":
                triple = text[self.pos:self.pos + 3]
                if len(triple) < 3 and len(text) - self.pos < 3:
                    break  # a triple quote may be coming: wait for it
                self.quote = triple if triple in ("'''", '"""') else char
                self.pos += len(self.quote)
                continue
            if char in "([{":
                if char == "(" and self.depth == 1:
                    name = text[self.element:self.pos].strip()
                    if _NAME_RE.match(name) and self.index is None:
                        self.index, self.started = self.started, self.started + 1
                        deltas.append(CallDelta(self.index, name=name))
                self.depth += 1
                if self.depth == 1:
                    self.element = self.pos + 1
            elif char in ")]}":
                self.depth -= 1
                if self.depth == 0:
                    self._element_ended(text, deltas)
                    self.finished = True
            elif char == "," and self.depth == 1:
                self._element_ended(text, deltas)
                self.element = self.pos + 1
            self.pos += 1
        return deltas

    def _in_string(self, text: str) -> None:
        assert self.quote is not None
        if self.escaped:
            self.escaped = False
            self.pos += 1
        elif text[self.pos] == "\\":
            self.escaped = True
            self.pos += 1
        elif text.startswith(self.quote, self.pos):
            self.pos += len(self.quote)
            self.quote = None
        else:
            self.pos += 1

    def _element_ended(self, text: str, deltas: list[CallDelta]) -> None:
        index, self.index = self.index, None
        source = text[self.element:self.pos].strip()
        if index is None or not source:
            return
        try:
            call = _call(ast.parse(source, mode="eval").body)
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        if deltas and deltas[-1].index == index:
            deltas[-1].arguments += arguments
        else:
            deltas.append(CallDelta(index, arguments=arguments))
