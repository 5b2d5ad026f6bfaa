"""`llama3_json`: Llama 3.1/3.2/3.3 (and Llama 4) JSON tool calls.

A call is one JSON object `{"name": ..., "parameters": {...}}` (some models prefix
`<|python_tag|>`); several calls are objects separated by `; `. vLLM: `Llama3JsonToolParser`,
which reads every top-level object in the output and drops the text around them.
"""

from __future__ import annotations

import json
from typing import Any

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, ToolFormat, arguments_obj
from app.formats.tool_formats.incremental import CallStream, LooseObjects

PYTHON_TAG = "<|python_tag|>"

# Llama 3.1's own JSON tool prompt (its chat template's `tools_in_user_message` text).
TOOL_PROMPT = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name '
    'and its value}}.Do not use variables.\n\n{tools}'
)

_DECODER = json.JSONDecoder()


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    vllm_parser = "llama3_json"
    start_marker = '{"name"'

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        listing = "".join(json.dumps(t, ensure_ascii=False, indent=4) + "\n\n" for t in tools)
        return TOOL_PROMPT.format(tools=listing)

    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        return "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False,
                       **(style or {}))
            for c in calls
        )

    def call_start(self, text: str) -> int:
        tagged = text.find(PYTHON_TAG)
        return tagged if tagged >= 0 else text.find("{")

    def stream_content(self, text: str) -> tuple[str, bool]:
        """vLLM streams a call only when the output opens with one (`{` or the python tag);
        any other output is content as it comes."""
        if text.startswith((PYTHON_TAG, "{")):
            return "", True
        if PYTHON_TAG.startswith(text):
            return "", False
        return text, False

    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        return LooseObjects()

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        """Every top-level JSON object is a call (`arguments` or `parameters`); if any `{`
        does not open such an object, the whole text is content, as in vLLM."""
        calls: list[ParsedCall] = []
        end = -1
        for start, char in enumerate(text):
            if char != "{" or start <= end:
                continue
            try:
                obj, length = _DECODER.raw_decode(text[start:])
            except json.JSONDecodeError:
                return ParsedOutput(content=text, calls=[])
            end = start + length
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return ParsedOutput(content=text, calls=[])
            if "arguments" in obj:
                args = obj["arguments"]
            elif "parameters" in obj:
                args = obj["parameters"]
            else:
                return ParsedOutput(content=text, calls=[])
            calls.append(ParsedCall(obj["name"], _as_dict(arguments_obj(args))))
        if not calls:
            return ParsedOutput(content=text, calls=[])
        return ParsedOutput(content=None, calls=calls)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
