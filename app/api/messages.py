"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API, served by the
chat completion machinery (sidecar, speculation, tools, `ooo_spec`), as `responses.py` serves
OpenAI's Responses API.

A request becomes a chat request (`to_chat_request`): `system` the system message; a user
message's `text` blocks its text and each `tool_result` block a tool message; an assistant
message's `text` its content and its `tool_use` blocks its tool calls (`thinking` blocks of
earlier turns are dropped, as the model's own template drops earlier thoughts); `tools` with
`input_schema` as functions; `tool_choice` auto/any/tool/none as auto/required/named/none;
`stop_sequences` as `stop`; `thinking` as the chat template's `enable_thinking` switch (what the
main model's reasoning parser reads); `output_config.format` as `response_format`;
`metadata.user_id` as `user`. The chat completion becomes a `message` (`to_message`): a
`thinking` block, a `text` block, a `tool_use` block per call, `stop_reason` and `usage` in
Anthropic's terms, and `ooo_spec` beside them. Streaming (`stream_events`) translates the chat
route's own chunks (app/api/streaming.py: text, reasoning and calls read as they are decoded)
into the Messages event sequence. Errors take Anthropic's envelope (`error_body`).

vLLM's own models (`vllm.entrypoints.anthropic.protocol`) import torch and the engine, which
the router never loads, so the wire models here are minimal ones of our own;
tests/unit/test_messages_api.py holds them to vLLM's on sample bodies.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.api.errors import ApiError, encodable, validated
from app.openai_models import ChatCompletionRequest, OooSpecOptions

logger = logging.getLogger(__name__)

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


# ----- the request --------------------------------------------------------------------------
class _Block(BaseModel):
    # Blocks a client sends back carry `cache_control`, `citations`, `signature`: nothing here
    # reads them, and they change nothing about the output.
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None

    def text(self) -> str:
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "\n".join(block.text for block in self.content)
        # The model should know a call failed; a tool message has no flag for it.
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str | None = None


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")  # `cache_control`

    # None or "custom": a client tool. Anthropic's server tools (web search, code execution,
    # ...) name a versioned type and have no schema: refused in `to_chat_request`.
    type: str | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs 'name'")
        return self


class ThinkingEnabled(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted", "updates"] | None = None


class ThinkingDisabled(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["disabled"]


class ThinkingAdaptive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["adaptive"]
    display: Literal["summarized", "omitted", "updates"] | None = None


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive,
                     Field(discriminator="type")]


class JsonOutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: JsonOutputFormat | None = None
    # `effort` is not taken: the chat path has no reasoning effort to map it to.


class _Conversation(BaseModel):
    """What a Messages request and a count_tokens request share: the prompt."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # vLLM's extension: extra variables for the chat template, as on chat completions.
    chat_template_kwargs: dict[str, Any] | None = None
    # Anthropic's prompt-caching hint: accepted; the engine's prefix cache needs none.
    cache_control: dict[str, Any] | None = None


class MessagesRequest(_Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    metadata: dict[str, Any] | None = None
    # Accepted; one tier here.
    service_tier: Literal["auto", "standard_only"] | None = None
    ooo_spec: OooSpecOptions = Field(default_factory=OooSpecOptions)

    @model_validator(mode="after")
    def _thinking_fits(self) -> MessagesRequest:
        # As Anthropic and vLLM: the thoughts' budget is part of `max_tokens`.
        if isinstance(self.thinking, ThinkingEnabled) and \
                self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


class CountTokensRequest(_Conversation):
    pass


def _system(request: _Conversation) -> list[dict[str, Any]]:
    if not request.system:
        return []
    text = (request.system if isinstance(request.system, str)
            else "\n".join(block.text for block in request.system))
    return [{"role": "system", "content": text}] if text else []


def _user(message: Message, index: int) -> list[dict[str, Any]]:
    """A user message: its `tool_result` blocks as tool messages, its text as user messages,
    in their order."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append({"role": "user", "content": "\n".join(text)})
            text.clear()

    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolResultBlock):
            flush()
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": block.text()})
        else:
            raise ApiError(400, f"messages[{index}]: a user message cannot hold a "
                           f"'{block.type}' block", param=f"messages[{index}].content")
    flush()
    if not out:
        raise ApiError(400, f"messages[{index}]: the message has no content",
                       param=f"messages[{index}].content")
    return out


def _assistant(message: Message, index: int) -> dict[str, Any]:
    """An assistant message: text blocks its content, `tool_use` blocks its calls; earlier
    thoughts are dropped."""
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            raise ApiError(400, f"messages[{index}]: a 'tool_result' block belongs in a user "
                           "message", param=f"messages[{index}].content")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def chat_messages(request: _Conversation) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages."""
    messages = _system(request)
    for index, message in enumerate(request.messages):
        if message.role == "user":
            messages.extend(_user(message, index))
        else:
            messages.append(_assistant(message, index))
    return messages


def _tools(request: _Conversation) -> list[dict[str, Any]]:
    tools = []
    for index, tool in enumerate(request.tools or []):
        if tool.type not in (None, "custom"):
            raise ApiError(400, f"tools[{index}] is a '{tool.type}' server tool, which this "
                           "server does not run; offer client tools (with 'input_schema')",
                           param=f"tools[{index}].type", code="unsupported_tool")
        if tool.input_schema is None:
            raise ApiError(400, f"tools[{index}] ('{tool.name}') needs 'input_schema'",
                           param=f"tools[{index}].input_schema")
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _template_kwargs(request: _Conversation) -> dict[str, Any] | None:
    """`chat_template_kwargs` with `thinking` as the template's `enable_thinking` switch (the
    one the reasoning parsers read, app/formats/reasoning.py); an explicit kwarg wins. Without
    `thinking` the template's default holds, as in vLLM."""
    kwargs = dict(request.chat_template_kwargs or {})
    if request.thinking is not None:
        kwargs.setdefault("enable_thinking", request.thinking.type != "disabled")
    return kwargs or None


def _chat_data(request: _Conversation) -> dict[str, Any]:
    data: dict[str, Any] = {"model": request.model, "messages": chat_messages(request),
                            "chat_template_kwargs": _template_kwargs(request)}
    tools = _tools(request)
    if tools:
        data["tools"] = tools
    if request.tool_choice is not None:
        if request.tool_choice.type == "any" and not tools:
            raise ApiError(400, "tool_choice 'any' needs at least one tool in 'tools'",
                           param="tool_choice")
        data["tool_choice"] = _tool_choice(request.tool_choice)
        if request.tool_choice.disable_parallel_tool_use:
            data["parallel_tool_calls"] = False
    fmt = request.output_config.format if request.output_config else None
    if fmt is not None:
        data["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt.json_schema}}
    return data


def top_k_supported() -> bool:
    """Whether the chat path takes `top_k` (the sampling fields of issue 42, item 3)."""
    return "top_k" in ChatCompletionRequest.model_fields


def to_chat_request(request: MessagesRequest) -> ChatCompletionRequest:
    """The chat request a Messages request runs as (see the module's docstring)."""
    data = _chat_data(request)
    data.update({
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": request.stop_sequences or None,
        "stream": request.stream,
        "ooo_spec": request.ooo_spec.model_dump(),
    })
    user = (request.metadata or {}).get("user_id")
    if isinstance(user, str):
        data["user"] = user
    if request.top_k is not None:
        if top_k_supported():
            data["top_k"] = request.top_k
        elif request.top_k not in (-1, 0):  # 0 and -1 turn top-k off
            raise ApiError(400, "'top_k' is not supported on this server yet: the chat path "
                           "has no top-k sampling", param="top_k")
    return validated(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None})


def count_chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request whose prompt count_tokens counts (one token asked: it decodes none)."""
    data = _chat_data(request)
    data["max_tokens"] = 1
    return validated(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None})


# ----- the response -------------------------------------------------------------------------
def stop_reason(finish_reason: str | None, stop: str | None = None
                ) -> tuple[StopReason, str | None]:
    """(`stop_reason`, `stop_sequence`) of a chat choice's finish reason and the stop string
    that ended it, if one did (vLLM's `stop_reason`)."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def usage(completion: dict[str, Any]) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` are the prompt tokens the prefix cache did not serve
    (its total input is `input_tokens + cache_read_input_tokens`), as vLLM counts them."""
    chat = completion["usage"]
    cached = int((chat.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"input_tokens": max(0, chat["prompt_tokens"] - cached),
            "output_tokens": chat["completion_tokens"],
            "cache_read_input_tokens": cached}


def tool_use_id(call_id: str) -> str:
    return f"toolu_{call_id.removeprefix('call_')}"


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        parsed = {}
        logger.warning("a tool call's arguments are not JSON; sent as {}")
    return {"type": "tool_use", "id": tool_use_id(call["id"]),
            "name": call["function"]["name"],
            "input": parsed if isinstance(parsed, dict) else {}}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def to_message(completion: dict[str, Any], model: str, message_id: str | None = None
               ) -> dict[str, Any]:
    """The `message` of one chat completion, with its `ooo_spec` report."""
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content.extend(_tool_use(call) for call in message.get("tool_calls") or [])
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"))
    return {"id": message_id or new_message_id(), "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": reason,
            "stop_sequence": sequence, "usage": usage(completion),
            "ooo_spec": completion["ooo_spec"]}


# ----- errors -------------------------------------------------------------------------------
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope; the HTTP status stays the project's (a 503 is Anthropic's
    529 `overloaded_error` in meaning, sent as 503, which the SDKs retry alike)."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": encodable(message)}}


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


# ----- the stream ---------------------------------------------------------------------------
def event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


class _Blocks:
    """The content blocks a stream has opened: one open at a time, indexed from 0."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # 'text' | 'thinking' | 'tool_use'

    def start(self, block: dict[str, Any]) -> list[str]:
        lines = self.stop()
        self.index += 1
        self.open = block["type"]
        return [*lines, event("content_block_start",
                              {"index": self.index, "content_block": block})]

    def ensure(self, kind: str) -> list[str]:
        """Open a `kind` block unless one is open."""
        if self.open == kind:
            return []
        empty = {"text": {"type": "text", "text": ""},
                 "thinking": {"type": "thinking", "thinking": "", "signature": ""}}[kind]
        return self.start(empty)

    def delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self.index, "delta": delta})

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]


def _chunk_events(blocks: _Blocks, delta: dict[str, Any]) -> list[str]:
    """One chat chunk's delta as content block events."""
    lines: list[str] = []
    if delta.get("reasoning"):
        lines += blocks.ensure("thinking")
        lines.append(blocks.delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
    if delta.get("content"):
        lines += blocks.ensure("text")
        lines.append(blocks.delta({"type": "text_delta", "text": delta["content"]}))
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if "id" in call:  # a new call: its own block
            lines += blocks.start({"type": "tool_use", "id": tool_use_id(call["id"]),
                                   "name": function.get("name", ""), "input": {}})
        if function.get("arguments"):
            lines.append(blocks.delta({"type": "input_json_delta",
                                       "partial_json": function["arguments"]}))
    return lines


async def stream_events(
    chunks: AsyncIterator[tuple[str, dict[str, Any]]], model: str,
) -> AsyncIterator[str]:
    """The Messages event sequence from one choice's chat chunks
    (`app.api.streaming.choice_chunks`): `message_start`; per content block
    `content_block_start`, its `text_delta`, `thinking_delta` or `input_json_delta`s,
    `content_block_stop`; `message_delta` with `stop_reason` and the usage (and `ooo_spec`);
    `message_stop`. An error after the start is an `error` event."""
    message_id = new_message_id()
    blocks = _Blocks()
    finish: str | None = None
    stop: str | None = None
    yield event("message_start", {"message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        # The prompt is counted with the result: its tokens come in `message_delta`.
        "usage": {"input_tokens": 0, "output_tokens": 0}}})
    try:
        async for kind, item in chunks:
            if kind == "chunk":
                for line in _chunk_events(blocks, item["choices"][0]["delta"]):
                    yield line
            elif kind == "finish":
                choice = item["choices"][0]
                finish, stop = choice["finish_reason"], choice.get("stop_reason")
            else:  # 'end': the completion
                for line in blocks.stop():
                    yield line
                choice = item["choices"][0]
                reason, sequence = stop_reason(finish or choice["finish_reason"],
                                               stop if stop is not None
                                               else choice.get("stop_reason"))
                yield event("message_delta", {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(item), "ooo_spec": item["ooo_spec"]})
                yield event("message_stop", {})
    except ApiError as err:
        yield event("error", {"error": error_body(err.status, err.message)["error"]})
    except Exception:  # the stream has started: report in-band, then close
        # The details go to the log only: an exception's text can carry internals.
        logger.exception("messages stream failed")
        yield event("error", {"error": error_body(500, "generation failed")["error"]})
