"""A known call written as the model would write it, for any format, without a renderer per
format.

- **Through the model's chat template**: a template that renders past assistant `tool_calls`
  (every tool-calling model's does) already knows the model's call syntax. The conversation
  is rendered with and without an assistant turn carrying the calls; the text between the
  assistant header (what the generation prompt adds) and the end of the turn is the call as
  the model writes it. The end of a turn is learnt the same way, from a turn whose content is
  a sentinel.
- **Harmony** (gpt-oss, the `openai` parser): through `openai-harmony`, which vLLM installs,
  as the model writes a call after the generation prompt `<|start|>assistant`:
  `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.

Whether a rendering is right is checked the other way round: rendered, then read by vLLM's
parser of the same name, it must give the same calls back (tests/unit/test_tool_formats_vllm.py).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from app.formats.tool_formats.base import ParsedCall

_SENTINEL = "\u2063OOO-SPEC-SENTINEL\u2063"
_USER = {"role": "user", "content": "ping"}


class TemplateRenderer:
    """Calls rendered through a chat template (`chat_template`, or the tokenizer's own)."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self._frame: tuple[str, str, str] | None = None

    def _apply(self, messages: list[dict[str, Any]], generation: bool) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))

    def frame(self) -> tuple[str, str, str]:
        """(the conversation before the assistant turn with its header, what the template puts
        before an assistant's content, what it puts after it: the turn's end)."""
        if self._frame is None:
            head = self._apply([_USER], True)
            probe = self._apply([_USER, {"role": "assistant", "content": _SENTINEL}], False)
            if not probe.startswith(head) or _SENTINEL not in probe:
                raise ValueError("the chat template does not render an assistant turn after "
                                 "the generation prompt")
            before, _, after = probe[len(head):].partition(_SENTINEL)
            self._frame = (head, before, after)
        return self._frame

    def render(self, calls: list[ParsedCall], first_index: int = 0) -> str:
        """The text the model writes for `calls` after the generation prompt. ValueError when
        the template does not render them."""
        head, before, end = self.frame()
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"functions.{c.name}:{first_index + i}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(calls)
            ],
        }
        text = self._apply([_USER, message], False)
        if not text.startswith(head):
            raise ValueError("the chat template renders the turn before a call differently")
        body = text[len(head):]
        if before and body.startswith(before):
            body = body[len(before):]
        if end and body.endswith(end):
            body = body[: len(body) - len(end)]
        if not body.strip():
            raise ValueError("the chat template does not render assistant tool calls")
        return body


@cache
def _harmony() -> Any:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


HARMONY_ASSISTANT = "<|start|>assistant"


def render_harmony(calls: list[ParsedCall], style: dict[str, Any] | None = None) -> str:
    """gpt-oss's calls after the generation prompt (`<|start|>assistant`): one commentary
    message per call, each after the first opening its own assistant message."""
    from openai_harmony import Message, Role

    encoding = _harmony()
    texts = []
    for call in calls:
        body = json.dumps(call.arguments, ensure_ascii=False, **(style or {}))
        message = (Message.from_role_and_content(Role.ASSISTANT, body)
                   .with_channel("commentary")
                   .with_recipient(f"functions.{call.name}")
                   .with_content_type("<|constrain|>json"))
        texts.append(encoding.decode_utf8(encoding.render(message)))
    text = "".join(texts)
    return text[len(HARMONY_ASSISTANT):] if text.startswith(HARMONY_ASSISTANT) else text
