"""What every tool-call format knows, and the pieces formats share.

A format is one dialect a model writes tool calls in (vLLM calls them tool parsers and chooses
one by name, `--tool-call-parser hermes`; `main.engine.tool_format` does the same here). A
format answers four questions:
- how the model is prompted with tools when its chat template ignores them (`system_prompt`,
  `prepare_messages`);
- how a call is written, so a predicted call can be rendered into the exact text the model
  would write (`render`, one text per whitespace style the model is seen to use: `render_variants`);
- where a call starts in free text (`start_marker`, `call_start`);
- how a finished output splits into content and calls (`parse`), agreeing with vLLM's parser
  of the same name (tests/unit/test_tool_formats.py checks each against it), and how calls
  are read while the output streams (`call_stream`, app/formats/tool_formats/incremental.py).

Forced calls (`tool_choice: required` or a named tool) do not depend on the format: vLLM's
structured outputs constrain them to JSON, and app/formats/tool_format.py renders and parses
them for every format.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from app.formats.tool_formats.incremental import CallStream


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    content: str | None
    calls: list[ParsedCall]


class ToolFormat(ABC):
    """One tool-call dialect. Stateless: one instance serves every request."""

    name: ClassVar[str]
    # The vLLM tool parser (`--tool-call-parser`) whose parsing this format agrees with.
    vllm_parser: ClassVar[str]
    # Text that opens a call in free text (what a client-side stream would switch on).
    start_marker: ClassVar[str]

    # ----- prompt (templates that ignore tools) ------------------------------------------
    @abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The tool listing and calling instructions put into the system message."""

    def tool_result_text(self, content: str) -> str:
        """A tool's result as the user turn the model reads it in."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def prepare_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        """Messages a chat template that knows nothing of tools can take: tools described in
        the system message, past assistant calls written in this format, tool results as
        user turns."""
        out: list[dict[str, Any]] = []
        for msg in messages:
            role = msg["role"]
            content = message_text(msg.get("content"))
            if role == "developer":
                role = "system"
            if role == "assistant" and msg.get("tool_calls"):
                calls = [
                    ParsedCall(c["function"]["name"], arguments_obj(c["function"]["arguments"]))
                    for c in msg["tool_calls"]
                ]
                content = "\n".join(([content] if content else []) + [self.past_calls(calls)])
            elif role == "tool":
                role = "user"
                content = self.tool_result_text(content)
            out.append({"role": role, "content": content})
        return with_system_text(out, self.system_prompt(tools)) if tools else out

    def past_calls(self, calls: list[ParsedCall]) -> str:
        """Earlier calls of the conversation, as the fallback prompt shows them."""
        return self.render(calls)

    # ----- writing calls -----------------------------------------------------------------
    @abstractmethod
    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        """The text the model writes for `calls` in free decoding, in one whitespace style
        (json.dumps keyword arguments; formats that are not JSON ignore it)."""

    # Whitespace styles the model is seen to use; the proposer follows whichever the model's
    # own tokens agree with.
    styles: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def render_variants(self, calls: list[ParsedCall]) -> list[str]:
        """Every text the model may write for `calls`, one per style, without repeats."""
        return list(dict.fromkeys(self.render(calls, style) for style in self.styles))

    # ----- reading calls -----------------------------------------------------------------
    def call_start(self, text: str) -> int:
        """Index in `text` where the first call starts; -1 when none has started."""
        return text.find(self.start_marker)

    def stream_content(self, text: str) -> tuple[str, bool]:
        """While an output streams: (the content that can be sent now, whether a call has
        started). Before a call, a suffix that may be the start of the marker is held back
        (as vLLM's streaming parsers hold back a partial `<tool_call>`)."""
        start = self.call_start(text)
        if start >= 0:
            return text[:start], True
        for size in range(min(len(self.start_marker) - 1, len(text)), 0, -1):
            if self.start_marker.startswith(text[-size:]):
                return text[:-size], False
        return text, False

    def writes_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> bool:
        """True when `text` (a chat template's rendering of a past call of one of `tools`) has
        a call in this format: how a template's own dialect is told apart from the configured
        one."""
        return self.start_marker in text

    # Whether the format reads outputs with vLLM's parser of its name (and so needs the
    # tokenizer): app/formats/tool_formats/vllm_format.py.
    vllm_backed: ClassVar[bool] = False

    @abstractmethod
    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        """A fresh reader of one output's calls as it streams, fed from `call_start` on."""

    @abstractmethod
    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        """A finished output split into content and calls, as vLLM's parser of the same name
        splits it; an output that is not a well-formed call is all content. `tools`: the
        request's (parsers that type argument values by their schema read them)."""


# ----- shared helpers --------------------------------------------------------------------
def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` after the system message's own (or as the system message)."""
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + text}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # OpenAI content parts: only text parts are meaningful to a text model.
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def arguments_obj(arguments: Any) -> Any:
    """A call's arguments as an object: clients send them as a JSON string."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def tool_listing(tools: list[dict[str, Any]], indent: int | None = None) -> str:
    """One JSON function description per line (or block, with `indent`)."""
    return "\n".join(json.dumps(t["function"], ensure_ascii=False, indent=indent) for t in tools)
