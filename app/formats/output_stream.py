"""One output read as it streams: reasoning, then content, then tool calls, as vLLM's
streaming parsers split it (`reasoning` deltas inside `<think>…</think>`, `content` deltas
until a call starts, then `tool_calls` deltas).

Nothing is sent that the finished output's parse would contradict, as far as the text so far
can tell: a suffix that may be the start of a marker (`<tool_call>`, `</think>`) is held back
until the next piece shows what it is, and so is trailing whitespace before a call (the
finished hermes parse strips it). The finished parse (app/main_model/service.py) stays the
truth; app/api/streaming.py sends, at the end, whatever this did not.

A format read by vLLM's own parser (`ToolFormat.vllm_backed`: every vLLM tool-parser name but
the four hand-written ones) is read here by vLLM's `Parser.parse_delta` with its reasoning
parser, piece by piece: its reasoning, content and call deltas are vLLM's
(app/formats/tool_formats/vllm_parsing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.formats.reasoning import Reasoning
from app.formats.tool_formats import ToolFormat
from app.formats.tool_formats.incremental import CallDelta, CallList, CallStream
from app.formats.tool_formats.vllm_parsing import VllmParsing, VllmStream

_QWEN3_TOOL_START = "<tool_call>"


@dataclass
class OutputDelta:
    """What one piece of output adds."""

    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class OutputStream:
    """One choice's output, fed piece by piece (`feed`).

    `mode`: the request's effective tool choice ('none', 'auto', 'required', 'named');
    `tool_format`: the format a free (`auto`) output's calls are written in; `reasoning`:
    the request's reasoning parser, or None."""

    def __init__(
        self,
        mode: str,
        tool_format: ToolFormat,
        reasoning: Reasoning | None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        """`tools`: the request's (vLLM's XML parsers type argument values by them)."""
        self.mode = mode
        self.format = tool_format
        self.reasoning = reasoning
        self.text = ""
        self.content_start: int | None = None if reasoning is not None else 0
        self.sent_reasoning = ""
        self.sent_content = ""
        self.calls: CallStream | None = None
        self.vllm: VllmStream | None = None
        if mode in ("required", "named"):  # JSON from the first token: all of it is calls
            self.calls = CallList(single=mode == "named")
        elif tool_format.vllm_backed:
            self.vllm = vllm_stream(tool_format, reasoning, tools if mode == "auto" else None)

    def feed(self, piece: str, token_ids: list[int] | None = None) -> OutputDelta:
        """`token_ids`: the piece's, when the caller has them (vLLM-read formats encode the
        piece again otherwise)."""
        if self.vllm is not None:
            self.text += piece
            read = self.vllm.feed(piece, token_ids)
            return OutputDelta(read.reasoning, read.content, read.calls)
        self.text += piece
        delta = OutputDelta()
        if self.content_start is None:
            self._reasoning(delta)
            if self.content_start is None:
                return delta
            piece = self.text[self.content_start:]
        if self.calls is None:
            piece = self._content(delta)
        if self.calls is not None and piece:
            delta.calls = self.calls.feed(piece)
        return delta

    def _reasoning(self, delta: OutputDelta) -> None:
        assert self.reasoning is not None
        end = self.reasoning.ended_at(self.text)
        if end is None:
            markers = [self.reasoning.start, self.reasoning.end]
            if self.reasoning.parser == "qwen3":
                markers.append(_QWEN3_TOOL_START)
            held = max(_held(self.text, m) for m in markers)
            thoughts, _ = self.reasoning.split(self.text[:len(self.text) - held])
        else:
            thoughts, _ = self.reasoning.split(self.text[:end])
            self.content_start = end
        thoughts = thoughts or ""
        if thoughts.startswith(self.sent_reasoning):
            delta.reasoning = thoughts[len(self.sent_reasoning):]
            self.sent_reasoning = thoughts

    def _content(self, delta: OutputDelta) -> str:
        """Send the content that is sure; returns the text of a call that has started."""
        assert self.content_start is not None
        body = self.text[self.content_start:]
        if self.mode != "auto":
            sendable, started = body, False
        else:
            sendable, started = self.format.stream_content(body)
            # Whitespace before a call is not content (hermes strips it): wait for more.
            sendable = sendable.rstrip()
        if sendable.startswith(self.sent_content):
            delta.content = sendable[len(self.sent_content):]
            self.sent_content = sendable
        if not started:
            return ""
        self.calls = self.format.call_stream()
        start = self.format.call_start(body)
        return body[start:] if start >= 0 else ""


def vllm_stream(
    tool_format: ToolFormat, reasoning: Reasoning | None, tools: list[dict[str, Any]] | None
) -> VllmStream:
    """vLLM's streaming parser for the format's tool parser and the request's reasoning
    parser (with its thinking switch, as vLLM's reads `chat_template_kwargs`)."""
    parsing = getattr(tool_format, "parsing", None)
    if parsing is None:
        raise RuntimeError(f"tool format {tool_format.name!r} needs the main model's tokenizer")
    both = VllmParsing(tool_format.name, reasoning.parser if reasoning is not None else None,
                       parsing.tokenizer)
    return both.stream(tools, reasoning.vllm_kwargs if reasoning is not None else None)


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
