"""Model outputs read by vLLM's own parsers, by name, as `vllm serve` reads them.

vLLM 0.32 composes a tool parser (`--tool-call-parser`) and a reasoning parser
(`--reasoning-parser`) into one `Parser` (`vllm.parser.parser_manager.ParserManager`): `parse`
splits a finished output into reasoning, content and calls, `parse_delta` reads it as it
streams. ooo-spec builds the same class from the same names and the main model's tokenizer,
so its messages and its streamed `reasoning`, `content` and `tool_calls` deltas are the ones
`vllm serve` sends for the same text and tokens.

Two differences from vLLM's serving layer, both on purpose:
- the token ids of a piece are the engine's when the caller has them and otherwise the piece
  encoded again with the tokenizer (the router streams text; special tokens, which most
  parsers switch on, encode back to themselves);
- gpt-oss's harmony format is read from harmony token ids (`openai-harmony`'s encoding) as
  vLLM does for `model_type: gpt_oss`, whatever tokenizer the engine runs (the embedded test
  model writes harmony's markers as added tokens).

vLLM is imported when a parser is first built, never at module level (a config load must not
wait for it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, arguments_obj
from app.formats.tool_formats.incremental import CallDelta

HARMONY_TOOL_PARSER = "openai"
HARMONY_REASONING_PARSER = "openai_gptoss"


def is_harmony(tool_parser: str | None, reasoning_parser: str | None) -> bool:
    return tool_parser == HARMONY_TOOL_PARSER or reasoning_parser == HARMONY_REASONING_PARSER


@cache
def parser_class(tool_parser: str | None, reasoning_parser: str | None) -> Any:
    """vLLM's unified `Parser` class for the two names (as `vllm serve` composes it)."""
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=tool_parser,
        reasoning_parser_name=reasoning_parser,
        enable_auto_tools=tool_parser is not None,
        is_harmony=is_harmony(tool_parser, reasoning_parser),
    )


@cache
def _harmony_encoding() -> Any:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def vllm_request(
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None = None,
    tool_choice: str = "auto",
) -> Any:
    """vLLM's chat request object for one of ooo-spec's: what the parsers read of it (the
    tools' schemas, which XML formats use to type argument values; the thinking switch)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="ooo-spec",
        messages=[{"role": "user", "content": ""}],
        tools=tools or None,
        tool_choice=tool_choice if tools else "none",
        chat_template_kwargs=template_kwargs,
    )


@lru_cache(maxsize=256)
def keeps_special_tokens(
    tool_parser: str | None,
    reasoning_parser: str | None,
    tokenizer: Any,
    with_tools: bool,
    tool_choice: str = "auto",
    template_kwargs_json: str = "{}",
) -> bool:
    """Whether `vllm serve` decodes a request's output with its special tokens: the parsers
    whose markers are special tokens in their models' tokenizers (Kimi's, GLM's, MiniMax's,
    Qwen3-Coder's, hermes' in some models, Gemma 4's channels; not DeepSeek V3.1's) turn
    `skip_special_tokens` off in `adjust_request`, or the markers would never reach the text
    they parse. Harmony is read from the text's
    harmony tokens here, so its markers are always kept. A parser vLLM will not build with
    this tokenizer (the hand-written formats' reason to be) keeps vLLM's default: skipped.
    Cached: only whether tools are offered, the choice and the template's variables matter."""
    if is_harmony(tool_parser, reasoning_parser):
        return True
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}] \
        if with_tools else None
    template_kwargs = json.loads(template_kwargs_json) or None
    request = vllm_request(tools, template_kwargs, tool_choice)
    parsing = VllmParsing(tool_parser, reasoning_parser, tokenizer)
    try:
        parser = parsing.new_parser(request, template_kwargs)
    except (RuntimeError, ValueError, ImportError):
        return False
    return parser.adjust_request(request).skip_special_tokens is False


@dataclass
class VllmParsing:
    """One main model's parsers: the two names and its tokenizer."""

    tool_parser: str | None
    reasoning_parser: str | None
    tokenizer: Any

    @property
    def harmony(self) -> bool:
        return is_harmony(self.tool_parser, self.reasoning_parser)

    def new_parser(self, request: Any, template_kwargs: dict[str, Any] | None = None) -> Any:
        cls = parser_class(self.tool_parser, self.reasoning_parser)
        if cls is None:
            raise ValueError("neither a tool parser nor a reasoning parser is named")
        kwargs = {"chat_template_kwargs": template_kwargs} if template_kwargs else {}
        return cls(self.tokenizer, request.tools, **kwargs)

    def token_ids(self, text: str) -> list[int]:
        if self.harmony:
            return list(_harmony_encoding().encode(text, allowed_special="all"))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def parse(
        self,
        text: str,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> tuple[str | None, ParsedOutput]:
        """(reasoning, content and calls) of a finished output, as vLLM's `Parser.parse`."""
        request = vllm_request(tools, template_kwargs)
        parser = self.new_parser(request, template_kwargs)
        ids = token_ids if token_ids is not None and not self.harmony else self.token_ids(text)
        reasoning, content, calls = parser.parse(
            text, request, enable_auto_tools=self.tool_parser is not None,
            model_output_token_ids=ids,
        )
        parsed = [ParsedCall(c.name, arguments_obj(c.arguments)) for c in calls or []]
        if any(not isinstance(c.arguments, dict) for c in parsed):
            # A call whose arguments are not a JSON object (cut by max_tokens, or split at
            # one of the format's markers written inside a string value): the text after the
            # reasoning comes back as content with no calls, as a forced JSON call cut short.
            reasoning, content, _ = self.new_parser(request, template_kwargs).parse(
                text, request, enable_auto_tools=False, model_output_token_ids=ids)
            return reasoning, ParsedOutput(content=content, calls=[])
        return reasoning, ParsedOutput(content=content, calls=parsed)

    def stream(
        self,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> VllmStream:
        request = vllm_request(tools, template_kwargs)
        return VllmStream(self, request, self.new_parser(request, template_kwargs),
                          prompt_token_ids or [])


@dataclass
class StreamPiece:
    """What one piece of output adds, in ooo-spec's terms (app/formats/output_stream.py)."""

    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


@dataclass
class VllmStream:
    """One output read by vLLM's `Parser.parse_delta`, piece by piece."""

    parsing: VllmParsing
    request: Any
    parser: Any
    prompt_token_ids: list[int]
    first: bool = True

    def feed(self, piece: str, token_ids: list[int] | None = None,
             finished: bool = False) -> StreamPiece:
        ids = (token_ids if token_ids is not None and not self.parsing.harmony
               else self.parsing.token_ids(piece))
        delta = self.parser.parse_delta(
            piece, ids, self.request,
            prompt_token_ids=self.prompt_token_ids if self.first else None,
            finished=finished,
        )
        self.first = False
        return to_piece(delta)


def to_piece(delta: Any) -> StreamPiece:
    """vLLM's `DeltaMessage` as ooo-spec's delta."""
    out = StreamPiece()
    if delta is None:
        return out
    out.reasoning = delta.reasoning or ""
    out.content = delta.content or ""
    for call in delta.tool_calls or []:
        function = call.function
        name = function.name if function is not None else None
        arguments = (function.arguments or "") if function is not None else ""
        if name is None and not arguments:
            continue
        out.calls.append(CallDelta(call.index, name=name, arguments=arguments))
    return out


def canonical_arguments(arguments: Any) -> str:
    """A call's arguments as the finished message carries them."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
