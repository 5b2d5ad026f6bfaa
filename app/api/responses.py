"""`POST /v1/responses`: the stateless subset of OpenAI's Responses API that agent frameworks
use, served by the chat completion machinery (sidecar, speculation, tools, `ooo_spec`).

A request becomes a chat request: `instructions` the system message, `input` a string (one user
message) or items (messages; `function_call` items as an assistant's tool calls;
`function_call_output` items as tool messages, `reasoning` items as the next assistant
turn's `reasoning`), function `tools`, `tool_choice`, `text.format`
as `response_format`, `max_output_tokens` as `max_tokens`. The chat completion becomes a
`response` object: a `message` item for text, a `function_call` item per call. Nothing is
stored: `previous_response_id` and `conversation` are 400s, and the response says
`store: false`. Streaming sends the Responses event sequence (`response.created` ...
`response.completed`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.api.errors import ApiError, describe_validation_errors, validated
from app.api.limits import json_object_body
from app.openai_models import (
    SEED_MAX,
    SEED_MIN,
    ChatCompletionRequest,
    OooSpecOptions,
    ReasoningEffort,
    SamplingFields,
)

logger = logging.getLogger(__name__)


class _Item(BaseModel):
    # Items a client sends back carry ids, statuses, annotations: not needed here.
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Item):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _carries_its_text(self) -> ContentPart:
        # As OpenAI: a part without its text is a 400, not an empty string.
        field = "refusal" if self.type == "refusal" else "text"
        if getattr(self, field) is None:
            raise ValueError(f"a '{self.type}' part needs '{field}', a string")
        return self


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or p.refusal or "" for p in self.content)


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text or "" for p in self.output)


class ReasoningPart(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Item):
    """An earlier turn's thinking, sent back by the client: the chat template of the next
    assistant turn gets it as that turn's `reasoning` (app/formats/chat_prompt.py)."""

    type: Literal["reasoning"]
    summary: list[ReasoningPart] = Field(default_factory=list)
    content: list[ReasoningPart] | None = None

    def text(self) -> str:
        # The thinking itself when the client kept it, else its summary (as vLLM reads it).
        parts = self.content if self.content else self.summary
        return "".join(p.text for p in parts)


class CustomToolCallItem(_Item):
    """A call of a `custom` (free-form) tool: its `input` is the text the model wrote."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str

    def arguments(self) -> str:
        # The function shim the model saw the tool as (`custom_tool_function`).
        return json.dumps({CUSTOM_TOOL_INPUT_KEY: self.input}, ensure_ascii=False)


class CustomToolCallOutputItem(FunctionCallOutputItem):
    type: Literal["custom_tool_call_output"]  # type: ignore[assignment]


InputItem = (MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
             | CustomToolCallItem | CustomToolCallOutputItem)


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


# vLLM's shim for a free-form `custom` tool (vllm/tool_parsers/utils.py): the model sees a
# function with one string parameter, and its call's `input` is that string.
CUSTOM_TOOL_INPUT_KEY = "input"


class CustomFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None


class CustomTool(BaseModel):
    """A free-form tool (as Codex's `apply_patch`): the model writes its input as text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomFormat | None = None

    @model_validator(mode="after")
    def _free_form_only(self) -> CustomTool:
        if self.format is not None and self.format.type == "grammar":
            # vLLM 0.32 refuses these too (its ResponsesRequest.check_custom_tool_format).
            raise ValueError(f"custom tool '{self.name}' has a {self.format.syntax or ''} "
                             "grammar format: grammar-constrained custom tools are not "
                             "supported (vLLM's Responses server refuses them too); give it "
                             "format {'type': 'text'} or make it a function tool with a JSON "
                             "schema")
        return self

    def function(self) -> dict[str, Any]:
        """The chat tool it is shown to the model as (vLLM's `custom_tool_as_function_dict`)."""
        return {"name": self.name, "description": self.description, "parameters": {
            "type": "object",
            "properties": {CUSTOM_TOOL_INPUT_KEY: {
                "type": "string", "description": "The freeform text payload for this tool."}},
            "required": [CUSTOM_TOOL_INPUT_KEY], "additionalProperties": False}}


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function", "custom"]
    name: str


class ReasoningOptions(BaseModel):
    """`reasoning`: `effort` is the chat template's thinking switch (as chat's
    `reasoning_effort`); a thinking model's reasoning comes back as a `reasoning` item with
    its text as `content` and no summary (nothing summarises it, as in vLLM)."""

    model_config = ConfigDict(extra="forbid")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its old name


# `include` values: the one answered, and why each other one is refused.
INCLUDE_ANSWERED = frozenset({"reasoning.encrypted_content"})
INCLUDE_REFUSED = {
    "message.output_text.logprobs": "logprobs are served on /v1/chat/completions and "
    "/v1/completions, not on /v1/responses",
    "message.input_image.image_url": "image inputs are not supported (a text model)",
    "computer_call_output.output.image_url": "built-in tools are not supported",
    "file_search_call.results": "built-in tools are not supported",
    "web_search_call.results": "built-in tools are not supported",
    "web_search_call.action.sources": "built-in tools are not supported",
    "code_interpreter_call.outputs": "built-in tools are not supported",
}


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(SamplingFields):
    """OpenAI's Responses request, stateless, with vLLM's sampling extras (`SamplingFields`:
    `prompt_cache_key` and `session_id` are the cache-affinity key)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionTool | CustomTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    text: TextOptions | None = None
    # Nothing is stored: `false` (Codex's) accepted, `true` a 400 (the response says false).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = None
    # Refused with a clear message below when set.
    previous_response_id: str | None = None
    conversation: Any = None
    reasoning: ReasoningOptions | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    ooo_spec: OooSpecOptions = Field(default_factory=OooSpecOptions)

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        if self.previous_response_id is not None or self.conversation is not None:
            raise ValueError("stored responses are not supported: this server keeps no state; "
                             "send the whole conversation in 'input' (previous_response_id "
                             "and conversation must be unset)")
        if self.store:
            raise ValueError("'store: true' is not supported: this server stores no response; "
                             "send store: false and the whole conversation in 'input'")
        for value in self.include or []:
            if value not in INCLUDE_ANSWERED:
                reason = INCLUDE_REFUSED.get(value, "not a value this server knows")
                raise ValueError(f"include '{value}' is not supported: {reason}; supported: "
                                 f"{', '.join(sorted(INCLUDE_ANSWERED))}")
        return self

    @property
    def custom_tool_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools or [] if isinstance(t, CustomTool))


def parse_responses_request(body: bytes, max_bytes: int) -> ResponsesRequest:
    data = json_object_body(body, max_bytes)
    return validated(ResponsesRequest, data)


def _item(raw: dict[str, Any], index: int) -> InputItem:
    kind = raw.get("type", "message")
    model: type[InputItem]
    if kind == "message":
        model = MessageItem
    elif kind == "function_call":
        model = FunctionCallItem
    elif kind == "function_call_output":
        model = FunctionCallOutputItem
    elif kind == "reasoning":
        model = ReasoningItem
    elif kind == "custom_tool_call":
        model = CustomToolCallItem
    elif kind == "custom_tool_call_output":
        model = CustomToolCallOutputItem
    else:
        raise ApiError(400, f"input[{index}] has type '{kind}'; supported: message, "
                       "function_call, function_call_output, reasoning, custom_tool_call, "
                       "custom_tool_call_output", param=f"input[{index}]")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, _ = describe_validation_errors(exc.errors())
        raise ApiError(400, f"input[{index}]: {message}", param=f"input[{index}]") from None


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    thought: str | None = None  # a reasoning item's text, for the assistant turn after it
    for index, raw in enumerate(request.input):
        item = _item(raw, index)
        if isinstance(item, ReasoningItem):
            thought = (thought or "") + item.text()
            continue
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            arguments = (item.arguments() if isinstance(item, CustomToolCallItem)
                         else item.arguments)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if (last is not None and last["role"] == "assistant" and "tool_calls" in last
                    and thought is None):
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": item.text()})
        if thought is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning"] = thought
        if messages and messages[-1]["role"] != "tool":
            thought = None  # thinking belongs to the assistant turn right after it
    if not messages:
        raise ApiError(400, "'input' has no items", param="input")
    return messages


def to_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    data: dict[str, Any] = {
        "messages": chat_messages(request),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_output_tokens,
        "parallel_tool_calls": request.parallel_tool_calls,
        "ooo_spec": request.ooo_spec.model_dump(),
        "stream": request.stream,
        "seed": request.seed,
        **request.sampling_field_values(),
    }
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort is not None:
        data["reasoning_effort"] = effort
    if request.tools:
        data["tools"] = [{"type": "function", "function": (
            t.function() if isinstance(t, CustomTool)
            else t.model_dump(exclude={"type"}, exclude_none=True))} for t in request.tools]
    choice = request.tool_choice
    if isinstance(choice, FunctionChoice):
        data["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        data["tool_choice"] = choice
    fmt = request.text.format if request.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ApiError(400, "text.format 'json_schema' needs a 'schema'",
                           param="text.format")
        data["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}}
    elif fmt is not None:
        data["response_format"] = {"type": fmt.type}
    return validated(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None})


# ----- the response -------------------------------------------------------------------------
def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content if text or status == "completed" else []}


def _call_item(call: dict[str, Any], status: str = "completed",
               custom: frozenset[str] = frozenset()) -> dict[str, Any]:
    name = call["function"]["name"]
    if name in custom:  # a free-form tool's call: its input, as vLLM decodes the shim
        return {"type": "custom_tool_call", "id": f"ctc_{call['id'].removeprefix('call_')}",
                "call_id": call["id"], "name": name,
                "input": _custom_input(call["function"]["arguments"]), "status": status}
    return {"type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}",
            "call_id": call["id"], "name": name,
            "arguments": call["function"]["arguments"], "status": status}


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    payload = value.get(CUSTOM_TOOL_INPUT_KEY) if isinstance(value, dict) else None
    return payload if isinstance(payload, str) else arguments


def _reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    """A thinking model's reasoning, as vLLM's Responses server writes it; nothing is
    encrypted or stored, so `encrypted_content` (`include`) is always null."""
    return {"type": "reasoning", "id": item_id or f"rs_{uuid.uuid4().hex}", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": None, "status": "completed"}


def message_reasoning(message: dict[str, Any]) -> str | None:
    """The reasoning of a chat completion's message (vLLM 0.32 names it `reasoning`)."""
    text = message.get("reasoning") or message.get("reasoning_content")
    return text if isinstance(text, str) and text else None


class ResponseBuilder:
    """The `response` object around one chat completion, in every state of a stream."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request = request
        self.model = model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def body(self, status: str, output: list[dict[str, Any]],
             completion: dict[str, Any] | None = None) -> dict[str, Any]:
        fmt = (self.request.text.format if self.request.text and self.request.text.format
               else None)
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output,
            "instructions": self.request.instructions,
            "tools": [t.model_dump(exclude_none=True) for t in self.request.tools or []],
            "reasoning": (self.request.reasoning.model_dump(exclude_none=True)
                          if self.request.reasoning is not None else None),
            "prompt_cache_key": self.request.prompt_cache_key,
            "tool_choice": (self.request.tool_choice.model_dump()
                            if isinstance(self.request.tool_choice, FunctionChoice)
                            else self.request.tool_choice or "auto"),
            "parallel_tool_calls": self.request.parallel_tool_calls is not False,
            "temperature": self.request.temperature, "top_p": self.request.top_p,
            "max_output_tokens": self.request.max_output_tokens,
            "text": {"format": (fmt.model_dump(by_alias=True, exclude_none=True)
                                if fmt else {"type": "text"})},
            "previous_response_id": None, "store": False, "truncation": "disabled",
            "metadata": self.request.metadata or {}, "error": None,
            "incomplete_details": None, "usage": None,
        }
        if completion is not None:
            usage = completion["usage"]
            body["usage"] = {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {
                    "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"],
            }
            if status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["ooo_spec"] = completion["ooo_spec"]
        return body

    def final(self, completion: dict[str, Any], message_id: str | None = None,
              reasoning_id: str | None = None) -> dict[str, Any]:
        """The response of a finished completion (a stream passes its items' ids)."""
        choice = completion["choices"][0]
        message = choice["message"]
        output: list[dict[str, Any]] = []
        thought = message_reasoning(message)
        if thought is not None:
            output.append(_reasoning_item(thought, reasoning_id))
        if message.get("content"):
            output.append(_message_item(message_id or f"msg_{uuid.uuid4().hex}",
                                        message["content"], "completed"))
        custom = self.request.custom_tool_names
        output.extend(_call_item(call, custom=custom)
                      for call in message.get("tool_calls") or [])
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        return self.body(status, output, completion)


class _ItemStream:
    """The output items of one streamed response as their events: the reasoning item
    (index 0) while the model thinks, then the message, then the calls, each closed before the
    next opens, numbered in order."""

    def __init__(self, reasoning_id: str, message_id: str) -> None:
        self.reasoning_id = reasoning_id
        self.message_id = message_id
        self.sequence = 0
        self.index = 0  # the output index of the item open now, or of the next one
        self.thinking = ""
        self.said = ""
        self.open: Literal["reasoning", "message"] | None = None

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def thought(self, piece: str) -> list[str]:
        """A piece of the reasoning: once the message has opened, the rest of it is only in the
        final response's reasoning item (items do not reopen)."""
        if not piece or self.said or self.open == "message":
            return []
        lines = []
        if self.open is None:
            item = {**_reasoning_item("", self.reasoning_id), "content": [],
                    "status": "in_progress"}
            lines.append(self.event("response.output_item.added", output_index=self.index,
                                    item=item))
            self.open = "reasoning"
        self.thinking += piece
        lines.append(self.event("response.reasoning_text.delta", item_id=self.reasoning_id,
                                output_index=self.index, content_index=0, delta=piece))
        return lines

    def text(self, piece: str) -> list[str]:
        if not piece:
            return []
        lines = self.close() if self.open == "reasoning" else []
        if self.open is None:
            lines += [
                self.event("response.output_item.added", output_index=self.index,
                           item=_message_item(self.message_id, "", "in_progress")),
                self.event("response.content_part.added", item_id=self.message_id,
                           output_index=self.index, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": [],
                                 "logprobs": []}),
            ]
            self.open = "message"
        self.said += piece
        lines.append(self.event("response.output_text.delta", item_id=self.message_id,
                                output_index=self.index, content_index=0, delta=piece,
                                logprobs=[]))
        return lines

    def close(self) -> list[str]:
        """Close the item open now, if any."""
        at = self.index
        if self.open == "reasoning":
            done = _reasoning_item(self.thinking, self.reasoning_id)
            lines = [
                self.event("response.reasoning_text.done", item_id=self.reasoning_id,
                           output_index=at, content_index=0, text=self.thinking),
                self.event("response.output_item.done", output_index=at, item=done),
            ]
        elif self.open == "message":
            part = {"type": "output_text", "text": self.said, "annotations": [], "logprobs": []}
            lines = [
                self.event("response.output_text.done", item_id=self.message_id,
                           output_index=at, content_index=0, text=self.said, logprobs=[]),
                self.event("response.content_part.done", item_id=self.message_id,
                           output_index=at, content_index=0, part=part),
                self.event("response.output_item.done", output_index=at,
                           item=_message_item(self.message_id, self.said, "completed")),
            ]
        else:
            return []
        self.open = None
        self.index += 1
        return lines

    def call(self, done: dict[str, Any]) -> list[str]:
        """A parsed call's item, whole: its input or arguments in one delta."""
        at = self.index
        self.index += 1
        if done["type"] == "custom_tool_call":
            return [
                self.event("response.output_item.added", output_index=at,
                           item={**done, "input": "", "status": "in_progress"}),
                self.event("response.custom_tool_call_input.delta", item_id=done["id"],
                           output_index=at, delta=done["input"]),
                self.event("response.custom_tool_call_input.done", item_id=done["id"],
                           output_index=at, input=done["input"]),
                self.event("response.output_item.done", output_index=at, item=done),
            ]
        return [
            self.event("response.output_item.added", output_index=at,
                       item={**done, "arguments": "", "status": "in_progress"}),
            self.event("response.function_call_arguments.delta", item_id=done["id"],
                       output_index=at, delta=done["arguments"]),
            self.event("response.function_call_arguments.done", item_id=done["id"],
                       output_index=at, arguments=done["arguments"], name=done["name"]),
            self.event("response.output_item.done", output_index=at, item=done),
        ]


async def stream_events(
    request: ResponsesRequest,
    chunks: AsyncIterator[tuple[str, dict[str, Any]]],
    model: str,
) -> AsyncIterator[str]:
    """The Responses event sequence from one choice's chat chunks
    (`app.api.streaming.choice_chunks`, which read the reasoning, the text and the calls as
    they are decoded): `response.created`, `response.in_progress`; a thinking model's
    `reasoning` item as it thinks (`reasoning_text.delta`s); the message as its text comes
    (`output_text.delta`s); each call's item once the output is parsed
    (`function_call_arguments.delta`/`.done`); then `response.completed` (or
    `response.incomplete` at `max_output_tokens`) with `ooo_spec`."""
    builder = ResponseBuilder(request, model)
    stream = _ItemStream(reasoning_id=f"rs_{uuid.uuid4().hex}",
                         message_id=f"msg_{uuid.uuid4().hex}")

    yield stream.event("response.created", response=builder.body("in_progress", []))
    yield stream.event("response.in_progress", response=builder.body("in_progress", []))
    try:
        async for kind, item in chunks:
            if kind == "chunk":
                delta = item["choices"][0]["delta"]
                for line in stream.thought(delta.get("reasoning") or ""):
                    yield line
                for line in stream.text(delta.get("content") or ""):
                    yield line
            elif kind == "end":
                message = item["choices"][0]["message"]
                for line in stream.close():
                    yield line
                for call in message.get("tool_calls") or []:
                    for line in stream.call(_call_item(call, custom=request.custom_tool_names)):
                        yield line
                final = builder.final(item, stream.message_id, reasoning_id=stream.reasoning_id)
                yield stream.event(f"response.{final['status']}", response=final)
    except ApiError as err:
        body = err.body()["error"]
        yield stream.event("error", code=body["code"], message=body["message"],
                           param=body["param"])
    except Exception:  # the stream has started: report in-band, then close
        # The details go to the log only: an exception's text can carry internals.
        logger.exception("responses stream failed")
        yield stream.event("error", code="server_error", message="generation failed", param=None)
