"""`hermes`: Hermes 2 Pro, Qwen2.5, Qwen3 (and the embedded SmolLM2 under the fallback prompt).

A call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; several calls are
several blocks, one per line. vLLM: `Hermes2ProToolParser`.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from app.formats.tool_formats.base import (
    ParsedCall,
    ParsedOutput,
    ToolFormat,
    arguments_obj,
    tool_listing,
)
from app.formats.tool_formats.incremental import CallStream, TaggedCalls

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

# The prompt SmolLM2 (whose template ignores tools) is given; NousResearch's Hermes prompt.
TOOL_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)


class HermesFormat(ToolFormat):
    name = "hermes"
    vllm_parser = "hermes"
    start_marker = TOOL_CALL_OPEN
    # Free decoding is seen in one style only (the prompt's example: one line).
    styles: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return TOOL_PROMPT.format(tools=tool_listing(tools))

    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        return "\n".join(call_block(c.name, c.arguments, style or {}) for c in calls)

    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        return TaggedCalls(TOOL_CALL_OPEN)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        """Content and `<tool_call>` blocks. More lenient than vLLM's parser where the model
        slips: a malformed block is skipped (vLLM gives the whole text back as content), an
        unclosed last block still counts (as in vLLM), `parameters` is read like `arguments`,
        and the content is stripped."""
        calls: list[ParsedCall] = []
        for match in _TOOL_CALL_RE.finditer(text):
            try:
                obj = json.loads(match.group(1))
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                args = obj.get("arguments", obj.get("parameters", {}))
                calls.append(ParsedCall(name=obj["name"], arguments=arguments_obj(args) or {}))
        if not calls:
            return ParsedOutput(content=text, calls=[])
        content = text[: text.find(TOOL_CALL_OPEN)].strip()
        return ParsedOutput(content=content or None, calls=calls)


def call_block(name: str, arguments: Any, style: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, **style)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"
