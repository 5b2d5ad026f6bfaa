"""Any vLLM tool parser by name: the format of every model vLLM serves with tool calls.

Reading is vLLM's own (app/formats/tool_formats/vllm_parsing.py): the finished output and
the stream go through vLLM's parser of the name with the main model's tokenizer. Writing a
known call is the model's own chat template (or openai-harmony for gpt-oss), through
app/formats/tool_formats/rendering.py. Nothing here is specific to one format: the start of
a call (where drafts switch to the call's text) is what every rendered call begins with.

A format is bound to a tokenizer (and the chat template, when it is not the tokenizer's own)
before it reads or writes anything: `get_format(name, tokenizer, chat_template)`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from app.formats.tool_formats.base import (
    ParsedCall,
    ParsedOutput,
    ToolFormat,
    tool_listing,
)
from app.formats.tool_formats.incremental import CallDelta, CallStream
from app.formats.tool_formats.rendering import TemplateRenderer, render_harmony
from app.formats.tool_formats.vllm_parsing import HARMONY_TOOL_PARSER, VllmParsing, VllmStream

_PROBES = (ParsedCall("probe_a", {"k": "v"}), ParsedCall("other_b", {"k": "v"}))


class VllmFormat(ToolFormat):
    """vLLM's tool parser `name`, with a tokenizer (and chat template) to read and write."""

    vllm_backed: ClassVar[bool] = True

    def __init__(self, name: str, tokenizer: Any = None, chat_template: str | None = None) -> None:
        self.name = name  # type: ignore[misc]
        self.vllm_parser = name  # type: ignore[misc]
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.harmony = name == HARMONY_TOOL_PARSER
        self.renderer = (TemplateRenderer(tokenizer, chat_template)
                         if tokenizer is not None and not self.harmony else None)
        self.parsing = VllmParsing(name, None, tokenizer) if tokenizer is not None else None
        if self.harmony:
            self.styles = ({}, {"separators": (",", ":")})  # type: ignore[misc]
        self.start_marker = self._start_marker()  # type: ignore[misc]

    def bound(self) -> VllmParsing:
        if self.parsing is None:
            raise RuntimeError(f"tool format {self.name!r} reads outputs with vLLM's parser "
                               "and needs the main model's tokenizer (get_format(name, tokenizer))")
        return self.parsing

    # ----- writing calls -----------------------------------------------------------------
    def render(self, calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
        if self.harmony:
            return render_harmony(calls, style)
        if self.renderer is None:
            raise ValueError(f"tool format {self.name!r} has no tokenizer to render with")
        return self.renderer.render(calls)

    def past_calls(self, calls: list[ParsedCall]) -> str:
        """A template that ignores tools writes no calls either: the fallback prompt shows
        earlier calls as JSON then."""
        try:
            return self.render(calls)
        except ValueError:
            return json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls],
                              ensure_ascii=False)

    def can_render(self) -> bool:
        try:
            self.render([_PROBES[0]])
        except Exception:
            return False
        return True

    def render_variants(self, calls: list[ParsedCall]) -> list[str]:
        """As the base, and nothing where the chat template does not write calls (no draft
        is better than one in a foreign syntax)."""
        try:
            return super().render_variants(calls)
        except ValueError:
            return []

    def _start_marker(self) -> str:
        """What every rendered call begins with (`<tool_call>\\n<function=`,
        `[TOOL_CALLS]`, ...): where a call starts in free text."""
        if not self.harmony and self.renderer is None:
            return ""
        try:
            first, second = (self.render([p]) for p in _PROBES)
        except Exception:
            return ""
        size = 0
        while size < min(len(first), len(second)) and first[size] == second[size]:
            size += 1
        return first[:size].lstrip()

    # ----- prompt (templates that ignore tools) ------------------------------------------
    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        example = ""
        try:
            example = self.render([ParsedCall("<function-name>", {"<key>": "<value>"})])
        except Exception:
            pass
        return ("You may call one or more functions to assist with the user query. Here are "
                f"the available functions:\n{tool_listing(tools)}\n"
                + (f"To call a function, write:\n{example}" if example else ""))

    # ----- reading calls -----------------------------------------------------------------
    def call_start(self, text: str) -> int:
        return text.find(self.start_marker) if self.start_marker else -1

    def stream_content(self, text: str) -> tuple[str, bool]:
        if not self.start_marker:
            return text, False
        return super().stream_content(text)

    def writes_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> bool:
        """Whether vLLM's parser of the name finds a call in `text` (a template's rendering of
        a past call of one of `tools`): the template and the parser agree. Some parsers
        (qwen3_coder) read only calls of the request's declared tools, so the probe's tools
        are passed."""
        if self.parsing is None:
            return super().writes_call(text, tools)
        try:
            return bool(self.parse(text, tools).calls)
        except Exception:
            return False

    def call_stream(self, tools: list[dict[str, Any]] | None = None) -> CallStream:
        return VllmCallStream(self.bound().stream(tools))

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        """vLLM's parse of `text`: its content and calls (`tools`: the request's, whose
        schemas some parsers use to type argument values)."""
        return self.bound().parse(text, tools)[1]


class VllmCallStream(CallStream):
    """A call's text read by vLLM's streaming parser (fed from the call's start on)."""

    def __init__(self, stream: VllmStream) -> None:
        super().__init__()
        self.stream = stream

    def feed(self, piece: str) -> list[CallDelta]:
        self.buffer += piece
        return self.stream.feed(piece).calls
