"""Chat completions as OpenAI server-sent events, streamed the way vLLM streams them.

Per choice: a role chunk; `reasoning` deltas while a thinking model thinks; `content` deltas
as the text is decoded, until a tool call starts; then `tool_calls` deltas, the call's
`index`, `id`, `type` and `function.name` first and `function.arguments` in pieces as they
are written (app/formats/output_stream.py reads the output; the formats' `call_stream`s read
the calls). At the end the finished response (the same the non-streamed request returns) is
the truth: whatever the stream has not sent yet of it goes out before the finish chunk, so
the deltas of a choice join to its non-streamed message (the ids of streamed calls are the
stream's own, and `ooo_spec.tool_results` names them). Then the usage chunk when asked, the
`ooo_spec` object on the last chunk, and `[DONE]`.

With `ooo_spec.execute_tools` the server may run a turn's calls and decode again, and only
the last turn is the response: the text is held back until the end (one content chunk, one
chunk per call), as it is for every choice whose output nothing reads as it streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.api.errors import ApiError
from app.formats.output_stream import OutputDelta, OutputStream
from app.formats.reasoning import Reasoning, ReasoningParserName
from app.formats.tool_format import new_call_id
from app.formats.tool_formats import ToolFormat, get_format
from app.formats.tool_formats.incremental import CallDelta
from app.openai_models import ChatCompletionRequest

logger = logging.getLogger(__name__)

Events = AsyncIterator[tuple[str, dict[str, Any]]]


def sse(data: dict[str, Any] | str) -> str:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {body}\n\n"


def chunk(
    completion_id: str, model: str, created: int, delta: dict[str, Any],
    finish_reason: str | None = None, logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                     "logprobs": logprobs}],
    }


def output_stream(
    request: ChatCompletionRequest,
    tool_format: ToolFormat,
    reasoning_parser: ReasoningParserName | None,
    forced_in_format: bool = False,
) -> OutputStream | None:
    """How one choice's output is read as it streams; None: held back until the end.
    `forced_in_format`: a forced call is written in the model's own format (a structural tag,
    app/formats/structural_tag.py), so it is read as the format's calls, not as JSON."""
    if request.ooo_spec.execute_tools:
        return None
    mode = request.effective_tool_choice
    # As the main model decides (MainModelService.prepare): forced and structured outputs are
    # JSON from the first token, no room to think.
    reasoning = Reasoning.for_request(
        reasoning_parser, request.chat_template_kwargs,
        getattr(tool_format, "tokenizer", None),  # vLLM-read formats carry the model's
    ) if mode in ("auto", "none") and request.output_schema is None else None
    if forced_in_format and mode in ("required", "named"):
        mode = "auto"  # the format's calls from the first token, as a free call is read
    return OutputStream(mode, tool_format, reasoning, request.tool_dicts() or None)


@dataclass
class _SentCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class _Sent:
    """What one choice's stream has sent so far."""

    reasoning: str = ""
    content: str = ""
    calls: list[_SentCall] = field(default_factory=list)

    def delta(self, out: OutputDelta) -> dict[str, Any]:
        """The wire delta of what the output stream read."""
        delta: dict[str, Any] = {}
        if out.reasoning:
            self.reasoning += out.reasoning
            # vLLM 0.32 names it `reasoning`; `reasoning_content` for clients of older vLLM
            # (as in the non-streamed message).
            delta["reasoning"] = delta["reasoning_content"] = out.reasoning
        if out.content:
            self.content += out.content
            delta["content"] = out.content
        if out.calls:
            delta["tool_calls"] = [self._call(c) for c in out.calls]
        return delta

    def _call(self, call: CallDelta) -> dict[str, Any]:
        if call.name is not None:
            assert call.index == len(self.calls)
            self.calls.append(_SentCall(new_call_id(), call.name, call.arguments))
            function = {"name": call.name}
            if call.arguments:
                function["arguments"] = call.arguments
            return {"index": call.index, "id": self.calls[-1].id, "type": "function",
                    "function": function}
        self.calls[call.index].arguments += call.arguments
        return {"index": call.index, "function": {"arguments": call.arguments}}

    def rest(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """Deltas of what the finished `message` has that was not sent: the text first, then
        one per call. What was sent and disagrees with it cannot be taken back: logged."""
        deltas: list[dict[str, Any]] = []
        text: dict[str, Any] = {}
        reasoning = _remainder(self.reasoning, message.get("reasoning") or "", "reasoning")
        if reasoning:
            text["reasoning"] = text["reasoning_content"] = reasoning
        content = _remainder(self.content, message.get("content") or "", "content")
        if content:
            text["content"] = content
        if text:
            deltas.append(text)
        final_calls = message.get("tool_calls") or []
        for index, call in enumerate(final_calls):
            function = call["function"]
            if index >= len(self.calls):
                deltas.append({"tool_calls": [{"index": index, **call}]})
                continue
            sent = self.calls[index]
            if sent.name != function["name"]:
                logger.warning("streamed call %d named %r, the finished output %r",
                               index, sent.name, function["name"])
            arguments = _remainder(sent.arguments, function["arguments"], "arguments")
            if arguments:
                sent.arguments += arguments
                deltas.append({"tool_calls": [{"index": index,
                                               "function": {"arguments": arguments}}]})
        if len(self.calls) > len(final_calls):
            logger.warning("streamed %d calls, the finished output has %d",
                           len(self.calls), len(final_calls))
        return deltas

    def stream_ids(self, final_calls: list[dict[str, Any]]) -> dict[str, str]:
        """The finished calls' ids → the ids their streamed deltas carried."""
        return {c["id"]: s.id for c, s in zip(final_calls, self.calls, strict=False)}


def _remainder(sent: str, final: str, what: str) -> str:
    if final.startswith(sent):
        return final[len(sent):]
    logger.warning("streamed %s is not a prefix of the finished %s", what, what)
    return ""


def _logprobs(request: ChatCompletionRequest, content: Any) -> dict[str, Any] | None:
    """A chunk's `logprobs` object, when the request asked for them."""
    if not request.logprobs:
        return None
    return {"content": content or []}


async def _choice_chunks(
    request: ChatCompletionRequest,
    events: Events,
    head: tuple[str, str, int],
    reader: OutputStream | None = None,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """One choice's chunks (index 0): ('chunk', chunk) for the role and each delta, then
    ('finish', finish chunk) and ('end', completion). `reader`: how the output is read as it
    streams (`output_stream`); None holds it back until the end."""
    sent = _Sent()
    yield "chunk", chunk(*head, {"role": "assistant", "content": ""})
    async for kind, event in events:
        if kind == "delta":
            if reader is None:
                continue
            delta = sent.delta(reader.feed(event["text"]))
            # Every token's logprobs go out with its step, as in vLLM, even in an empty delta.
            logprobs = _logprobs(request, event.get("logprobs"))
            if delta or (logprobs is not None and event.get("logprobs")):
                yield "chunk", chunk(*head, delta, logprobs=logprobs)
            continue
        choice = event["choices"][0]
        message = choice["message"]
        # Held text: the whole output's logprobs ride on its first chunk.
        held = choice["logprobs"] if reader is None else None
        for delta in sent.rest(message):
            yield "chunk", chunk(*head, delta, logprobs=held)
            held = None
        if held is not None:
            yield "chunk", chunk(*head, {}, logprobs=held)
        ids = sent.stream_ids(message.get("tool_calls") or [])
        report = event.get("ooo_spec")
        if report and ids and report.get("tool_results"):
            results = [{**r, "tool_call_id": ids.get(r["tool_call_id"], r["tool_call_id"])}
                       for r in report["tool_results"]]
            event = {**event, "ooo_spec": {**report, "tool_results": results}}
        yield "finish", chunk(*head, {}, choice["finish_reason"])
        yield "end", event


def choice_chunks(
    request: ChatCompletionRequest,
    events: Events,
    model: str,
    tool_format: ToolFormat | None = None,
    reasoning_parser: ReasoningParserName | None = None,
    forced_in_format: bool = False,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """One choice's chat chunks as `stream_sse` reads them, before they become SSE: what
    another wire format is translated from (the Messages API's events, app/api/messages.py).
    ('chunk', chunk) per delta, ('finish', finish chunk), ('end', completion)."""
    head = (f"chatcmpl-{uuid.uuid4().hex}", model, int(time.time()))
    fmt = tool_format if tool_format is not None else get_format("hermes")
    return _choice_chunks(request, events, head,
                          output_stream(request, fmt, reasoning_parser, forced_in_format))


async def _merged(
    streams: Sequence[AsyncIterator[tuple[str, dict[str, Any]]]],
) -> AsyncIterator[tuple[int, str, dict[str, Any]]]:
    """Items of several streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for kind, item in streams[0]:
            yield 0, kind, item
        return
    queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[tuple[str, dict[str, Any]]]) -> None:
        try:
            async for kind, item in stream:
                await queue.put((index, kind, item))
            await queue.put((index, "done", None))
        except BaseException as exc:
            await queue.put((index, "raised", exc))
            raise

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, kind, item = await queue.get()
            if kind == "done":
                running -= 1
            elif kind == "raised":
                raise item
            else:
                yield index, kind, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_sse(
    request: ChatCompletionRequest,
    events: Events | Sequence[Events],
    model: str,
    tool_format: ToolFormat | None = None,
    reasoning_parser: ReasoningParserName | None = None,
    forced_in_format: bool = False,
) -> AsyncIterator[str]:
    """OpenAI SSE (see the module docstring). `events`: one choice's events, or one per
    choice (`n` > 1); `tool_format` and `reasoning_parser`: the main model's
    (`main.engine.tool_format`, `main.engine.reasoning_parser`)."""
    streams = [events] if not isinstance(events, Sequence) else list(events)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    head = (completion_id, model, created)
    finishes: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    fmt = tool_format if tool_format is not None else get_format("hermes")
    try:
        choices = [_choice_chunks(request, s, head,
                                  output_stream(request, fmt, reasoning_parser, forced_in_format))
                   for s in streams]
        async for index, kind, item in _merged(choices):
            item["choices"] = [{**c, "index": index} for c in item.get("choices", [])]
            if kind == "chunk":
                yield sse(item)
            elif kind == "finish":
                finishes.append(item)
            else:
                ends.append(item)
        finishes.sort(key=lambda c: c["choices"][0]["index"])
        ends.sort(key=lambda c: c["choices"][0]["index"])
        for finish in finishes[:-1]:
            yield sse(finish)
        last = finishes[-1]
        include_usage = request.stream_options and request.stream_options.include_usage
        if include_usage:
            yield sse(last)
            last = {**chunk(*head, {}), "choices": [], "usage": merged_usage(ends)}
        last["ooo_spec"] = ends[0]["ooo_spec"]
        yield sse(last)
    except ApiError as err:
        yield sse(err.body())
    except Exception:  # the stream has started: report in-band, then close cleanly
        # The details go to the log (and the request's span), never to the client.
        logger.exception("chat completion stream failed")
        yield sse({"error": {"message": "generation failed", "type": "server_error",
                             "param": None, "code": None}})
    yield sse("[DONE]")


def merged_usage(completions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Usage of `n` choices as vLLM counts it: the prompt once (with its cached tokens, the
    first choice's), every choice's completion."""
    first = completions[0]["usage"]
    prompt = first["prompt_tokens"]
    generated = sum(c["usage"]["completion_tokens"] for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated,
            "prompt_tokens_details": first["prompt_tokens_details"]}
