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
tool format is one vLLM reads. Here, for drafting (`ended_at`) and the hand-written formats'
split, two things are asked of vLLM's parser of the name, built with the main model's
tokenizer and the request's `chat_template_kwargs` (`vllm_view`): whether it reads the output
as thinking at all (`not is_reasoning_end([])`: vLLM's parsers read different switches,
`enable_thinking`, `thinking`, or none, and some think only when switched on, as
deepseek_v3 and gemma4; gpt-oss's channels are harmony's to read, so its reasoning boundary
is passed from the first token), and the text markers around the reasoning
(`reasoning_start_str`, `reasoning_end_str`). Without a tokenizer, or where vLLM's parser
cannot be built, the reasoning is `<think>…</think>` and always on, as before.

The request's `chat_template_kwargs` travel with it (`template_kwargs`) to vLLM's parsers as
`vllm serve` passes them, never a switch rebuilt from `thinking`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Any vLLM reasoning parser's name; deepseek_r1 and qwen3 are read here.
ReasoningParserName = str

THINK_START = "<think>"
THINK_END = "</think>"
_QWEN3_TOOL_START = "<tool_call>"
_READ_HERE = ("deepseek_r1", "qwen3")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmView:
    """What vLLM's reasoning parser of a name says of one request (`vllm_view`)."""

    thinking: bool
    start: str
    end: str


def vllm_view(
    parser: ReasoningParserName, template_kwargs: Mapping[str, Any] | None, tokenizer: Any
) -> VllmView | None:
    """vLLM's parser of the name, built as `vllm serve` builds it for one request: whether
    it reads the output as (possibly) thinking, and its markers; None where it cannot be
    built with this tokenizer (its markers are not tokens of it)."""
    from vllm.reasoning import ReasoningParserManager

    try:
        built = ReasoningParserManager.get_reasoning_parser(parser)(
            tokenizer, chat_template_kwargs=dict(template_kwargs or {}))
        ended = bool(built.is_reasoning_end([]))
        start, end = built.reasoning_start_str, built.reasoning_end_str
    except Exception as exc:  # noqa: BLE001 - any parser's own refusal: the defaults hold
        logger.debug("reasoning parser %s not built: %s", parser, exc)
        return None
    return VllmView(thinking=not ended, start=start or THINK_START, end=end or THINK_END)


@dataclass(frozen=True)
class Reasoning:
    """One request's reasoning parser, with the request's thinking switch applied.
    `template_kwargs`: the request's own, for vLLM's parsers."""

    parser: ReasoningParserName
    thinking: bool = True
    start: str = THINK_START
    end: str = THINK_END
    template_kwargs: Mapping[str, Any] | None = None

    @classmethod
    def for_request(
        cls, parser: ReasoningParserName | None, template_kwargs: dict[str, Any] | None,
        tokenizer: Any = None,
    ) -> Reasoning | None:
        """`tokenizer`: the main model's, for vLLM's view of parsers not read here."""
        if parser is None:
            return None
        if parser in _READ_HERE or tokenizer is None:
            enabled = (template_kwargs or {}).get("enable_thinking", True)
            # qwen3's parser reads the switch (as in vLLM); deepseek_r1 always thinks.
            return cls(parser, thinking=bool(enabled) or parser != "qwen3",
                       template_kwargs=template_kwargs)
        view = vllm_view(parser, template_kwargs, tokenizer)
        if view is None:
            return cls(parser, template_kwargs=template_kwargs)
        return cls(parser, thinking=view.thinking, start=view.start, end=view.end,
                   template_kwargs=template_kwargs)

    @property
    def vllm_kwargs(self) -> dict[str, Any] | None:
        """The `chat_template_kwargs` vLLM's parsers read, as the request sent them."""
        return dict(self.template_kwargs) if self.template_kwargs else None

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output; None where there is none."""
        if not self.thinking:
            return None, text
        if self.parser == "qwen3":
            return self._split_qwen3(text)
        _, started, rest = text.partition(self.start)
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
        _, started, rest = text.partition(self.start)
        offset = len(text) - len(rest) if started else 0
        end = self._end(rest if started else text)
        return None if end is None else offset + end[0] + end[1]

    def _end(self, body: str) -> tuple[int, int] | None:
        """(index, length of the marker) where the reasoning in `body` ends."""
        close = body.find(self.end)
        if self.parser == "qwen3":
            call = body.find(_QWEN3_TOOL_START)
            if call >= 0 and (close < 0 or call < close):
                return call, 0  # the call belongs to the content
        return None if close < 0 else (close, len(self.end))
