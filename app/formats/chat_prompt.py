"""The main model's prompt: its own chat template when that template renders tools, else the
tool format's fallback prompt (tools described in the system message).

When the template renders tools, the messages and tools reach it the way vLLM's OpenAI server
hands them over (vllm/renderers: `parse_chat_messages`, `safe_apply_chat_template`): text
content as one string, assistant calls with their arguments as objects, tool results as `tool`
turns with their `tool_call_id`, the tool list as vLLM dumps it, and the request's
`chat_template_kwargs` (e.g. `enable_thinking`) passed on; the prompt text is then the same
bytes `vllm serve` would render (tests/unit/test_chat_prompt.py checks it against vLLM's code).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from app.formats.tool_formats.base import ToolFormat

# Keys a request may not set through chat_template_kwargs (vLLM refuses them too).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"chat_template", "tokenize", "tools", "conversation", "messages", "add_generation_prompt",
     "continue_final_message", "documents", "return_dict"}
)

_PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
_PROBE_NAME = "ooo_spec_probe_tool"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "Probe whether the template lists tools.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class TemplateTool:
    """One tool as the client sent it; `parameters` None when the client left it out (vLLM
    then hands the template `null`, not an empty schema)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None = None

    def vllm_dict(self) -> dict[str, Any]:
        """The tool as vLLM's `ChatCompletionToolsParam.model_dump()` gives it to templates."""
        function: dict[str, Any] = {
            "name": self.name, "description": self.description, "parameters": self.parameters,
        }
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


def template_renders_tools(tokenizer: ChatTokenizer) -> bool:
    """True when the chat template shows the model a tool list: the probe conversation
    renders differently with `tools=` than without."""
    plain = tokenizer.apply_chat_template(
        _PROBE_MESSAGES, tokenize=False, add_generation_prompt=True
    )
    try:
        with_tools = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template may reject an unexpected argument: it has no tools
        return False
    return bool(with_tools != plain)


_PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_probe", "type": "function",
    "function": {"name": "ooo_spec_probe_tool", "arguments": {"city": "Paris"}}}]}


def template_call_text(tokenizer: ChatTokenizer) -> str | None:
    """How the template writes a past assistant call: the text a probe call adds to the
    conversation, after the assistant header the generation prompt ends with (the model
    writes from there: harmony's parser reads no call behind a `<|start|>assistant` of its
    own); None when the template cannot render it."""
    try:
        before = str(tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False))
        after = str(tokenizer.apply_chat_template(
            [*_PROBE_MESSAGES, _PROBE_CALL], tools=_PROBE_TOOLS, tokenize=False))
        prompt = str(tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False, add_generation_prompt=True))
    except Exception:
        return None
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    written = after[common:]
    header = prompt[common:]
    return written[len(header):] if header and written.startswith(header) else written


def format_mismatch(tokenizer: ChatTokenizer, fmt: ToolFormat) -> str | None:
    """A warning when the chat template renders tools but writes calls in another dialect
    than the configured format (the model would then be parsed with the wrong parser), or
    never writes a past call at all (the probe call's name is not in its rendering)."""
    if not template_renders_tools(tokenizer):
        return None
    written = template_call_text(tokenizer)
    if written is not None and _PROBE_NAME not in written:
        return (
            f"the model's chat template renders tools but never renders a past tool call (a "
            f"call in the conversation comes out as {written.strip()[:120]!r}): the model "
            f"does not see its own earlier calls, and nothing shows it the {fmt.name!r} "
            f"format (main.engine.tool_format); use the model's own template, which writes "
            f"calls as vLLM's parser of that name reads them"
        )
    if written is None or fmt.writes_call(written, _PROBE_TOOLS):
        return None
    return (
        f"the model's chat template renders tools but writes a call as {written.strip()[:120]!r}, "
        f"which is not the {fmt.name!r} format (main.engine.tool_format); choose the format "
        f"vLLM would use for this model (--tool-call-parser)"
    )


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as vLLM hands them to a chat template (string content format)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        converted: dict[str, Any] = {"role": msg["role"], "content": _content(msg.get("content"))}
        if msg["role"] == "assistant" and msg.get("tool_calls") is not None:
            calls = [_template_call(c) for c in msg["tool_calls"]]
            if calls:  # vLLM drops an empty list so templates take the plain path
                converted["tool_calls"] = calls
        if msg["role"] == "assistant" and msg.get("reasoning") is not None:
            # An earlier turn's thinking, under both names as vLLM hands it over: templates
            # of interleaved-thinking models read `reasoning_content` (Kimi, GLM, MiniMax,
            # Qwen3 keeps it for turns after the last user message), the others ignore it.
            converted["reasoning"] = converted["reasoning_content"] = msg["reasoning"]
        if msg["role"] == "tool" and "tool_call_id" in msg:
            converted["tool_call_id"] = msg["tool_call_id"]
        if isinstance(msg.get("name"), str):
            converted["name"] = msg["name"]
        out.append(converted)
    return out


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Text parts joined by newlines, as vLLM's "string" content format does.
    return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    raw = function.get("arguments")
    parsed: Any = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw) if raw else {}
        except json.JSONDecodeError:  # vLLM keeps the conversation going with {}
            parsed = {}
    function["arguments"] = parsed if isinstance(parsed, dict) else {}
    return {**call, "function": function}


def template_variables(tokenizer: ChatTokenizer) -> frozenset[str]:
    """Variables the chat template reads; request kwargs reach the template only among these."""
    import jinja2
    from jinja2 import meta

    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return frozenset()
    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except jinja2.TemplateError:
        return frozenset()


def template_kwargs(
    requested: dict[str, Any] | None, variables: frozenset[str]
) -> dict[str, Any]:
    """The request's `chat_template_kwargs` the template reads; reserved names are an error
    (ValueError), as in vLLM."""
    requested = requested or {}
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & requested.keys())
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    return {k: v for k, v in requested.items() if k in variables}


def render_native(
    tokenizer: ChatTokenizer,
    messages: list[dict[str, Any]],
    tools: list[TemplateTool] | None,
    kwargs: dict[str, Any],
) -> str:
    """The prompt text through a template that renders tools: `tools` handed to it as vLLM
    hands them (None: the request has no tool list)."""
    return str(tokenizer.apply_chat_template(
        template_messages(messages),
        tools=[t.vllm_dict() for t in tools] if tools is not None else None,
        tokenize=False, add_generation_prompt=True, **kwargs,
    ))


def render_fallback(
    tokenizer: ChatTokenizer,
    fmt: ToolFormat,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    """The prompt text through a template that ignores tools: the format's prompt describes
    `tools` in the system message, past calls and results are written in the format."""
    return str(tokenizer.apply_chat_template(
        fmt.prepare_messages(messages, tools), tokenize=False, add_generation_prompt=True,
        **kwargs,
    ))
