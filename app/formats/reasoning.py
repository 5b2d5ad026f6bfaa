"""Thinking models: the `<think>…</think>` block is the model's own, split off the output the
way vLLM's reasoning parser of the same name splits it (`--reasoning-parser`), returned as the
message's reasoning and never parsed as a call; drafts start after it closes.

- `deepseek_r1`: an optional `<think>`, reasoning up to `</think>`; without `</think>` the
  whole output is reasoning.
- `qwen3`: the same, and a `<tool_call>` inside the reasoning ends it (Qwen3 may call without
  closing its thoughts); with `enable_thinking: false` in `chat_template_kwargs` the model
  does not think and the whole output is content.

Every other vLLM reasoning parser (app/vllm_names.py) is read by vLLM's own parser,
through the tool format's vLLM parser (app/formats/tool_formats/vllm_parsing.py) when the
tool format is one vLLM reads; here, for drafting (`ended_at`), its reasoning ends at
`</think>` as deepseek_r1's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Any vLLM reasoning parser's name; deepseek_r1 and qwen3 are read here.
ReasoningParserName = str

THINK_START = "<think>"
THINK_END = "</think>"
_QWEN3_TOOL_START = "<tool_call>"


@dataclass(frozen=True)
class Reasoning:
    """One request's reasoning parser, with the request's thinking switch applied."""

    parser: ReasoningParserName
    thinking: bool = True

    @classmethod
    def for_request(
        cls, parser: ReasoningParserName | None, template_kwargs: dict[str, Any] | None
    ) -> Reasoning | None:
        if parser is None:
            return None
        enabled = (template_kwargs or {}).get("enable_thinking", True)
        # Only qwen3's parser reads the switch (as in vLLM); deepseek_r1 always thinks.
        return cls(parser, thinking=bool(enabled) or parser != "qwen3")

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output; None where there is none."""
        if not self.thinking:
            return None, text
        if self.parser == "qwen3":
            return self._split_qwen3(text)
        _, started, rest = text.partition(THINK_START)
        body = rest if started else text
        end = self._end(body)
        if end is None:
            return body, None
        return body[:end[0]], body[end[0] + end[1]:] or None

    def _split_qwen3(self, text: str) -> tuple[str | None, str | None]:
        """vLLM's qwen3 parser is a token state machine: thinking from the first token, every
        `<think>` inside the thoughts dropped, `</think>` (or a `<tool_call>`) ends them, and
        a repeated `</think>` in the content is dropped too."""
        end = self._end(text)
        thoughts, content = (text, None) if end is None else (
            text[:end[0]], text[end[0] + end[1]:].replace(THINK_END, ""))
        return thoughts.replace(THINK_START, "") or None, content or None

    def ended_at(self, text: str) -> int | None:
        """Where the content starts in a streaming output once the reasoning has ended (the
        index after `</think>`, or of qwen3's `<tool_call>`); None while it goes on."""
        if not self.thinking:
            return 0
        if self.parser == "qwen3":  # thinking from the first token on
            end = self._end(text)
            return None if end is None else end[0] + end[1]
        _, started, rest = text.partition(THINK_START)
        offset = len(text) - len(rest) if started else 0
        end = self._end(rest if started else text)
        return None if end is None else offset + end[0] + end[1]

    def _end(self, body: str) -> tuple[int, int] | None:
        """(index, length of the marker) where the reasoning in `body` ends."""
        close = body.find(THINK_END)
        if self.parser == "qwen3":
            call = body.find(_QWEN3_TOOL_START)
            if call >= 0 and (close < 0 or call < close):
                return call, 0  # the call belongs to the content
        return None if close < 0 else (close, len(THINK_END))
