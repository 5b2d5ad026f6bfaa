"""`mistral`: Mistral 7B Instruct v0.3 and the other pre-v11 Mistral tokenizers.

A call list is `[TOOL_CALLS]` (a special token) followed by a JSON list of
`{"name": ..., "arguments": {...}}`; text before the marker is content. vLLM: `MistralToolParser`
(its pre-v11 path, chosen when the tokenizer has no `[ARGS]` token). The v11+ form
`[TOOL_CALLS]name[ARGS]{...}` (Mistral Small 3.2, Devstral) is not written here.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, ToolFormat, arguments_obj
from app.formats.tool_formats.incremental import CallList, CallStream

TOOL_CALLS = "[TOOL_CALLS]"
_LIST_RE = re.compile(r"\[{.*}\]", re.DOTALL)
_DECODER = json.JSONDecoder()

TOOL_PROMPT = (
    "You can call the following functions. Available tools:\n{tools}\n"
    "To call functions, answer with [TOOL_CALLS] followed by a JSON list of objects, each "
    'with the function\'s "name" and its "arguments" object:\n'
    '[TOOL_CALLS][{{"name": <function-name>, "arguments": <args-dict>}}]'
)


class MistralFormat(ToolFormat):
    name = "mistral"
    vllm_parser = "mistral"
    start_marker = TOOL_CALLS
    # The marker is a token of its own; the model may or may not put a space after it.
    styles: ClassVar[tuple[dict[str, Any], ...]] = ({}, {"_space": True})

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        listing = json.dumps(tools, ensure_ascii=False)
        return TOOL_PROMPT.format(tools=listing)

    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        style = dict(style or {})
        space = " " if style.pop("_space", False) else ""
        items = [{"name": c.name, "arguments": c.arguments} for c in calls]
        return TOOL_CALLS + space + json.dumps(items, ensure_ascii=False, **style)

    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        return CallList(TOOL_CALLS)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        """Content before the first marker; the first JSON value after a marker holds the
        calls (a list, or one object); no calls in it: the JSON is given back as content."""
        if TOOL_CALLS not in text:
            return ParsedOutput(content=text, calls=[])
        content, *segments = text.split(TOOL_CALLS)
        body = next((s.strip() for s in segments if s.strip()), "")
        parsed: Any = None
        try:
            parsed, _ = _DECODER.raw_decode(body)
        except json.JSONDecodeError:
            found = _LIST_RE.findall(body)
            try:
                parsed = json.loads(found[0]) if found else None
            except json.JSONDecodeError:
                parsed = None
        calls = _calls(parsed)
        if not calls:
            return ParsedOutput(content=body, calls=[])
        return ParsedOutput(content=content if content.strip() else None, calls=calls)


def _calls(parsed: Any) -> list[ParsedCall]:
    items = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(items, list):
        return []
    calls: list[ParsedCall] = []
    for item in items:
        if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
            continue
        name = item.get("name")
        args = arguments_obj(item.get("arguments") or {})
        calls.append(ParsedCall(name if isinstance(name, str) else "",
                                args if isinstance(args, dict) else {}))
    return calls
