"""How the main model sees tools and writes tool calls (the "hermes" format).

Two ways a call is written, and both are what candidates are rendered into:
- free decoding (`tool_choice: auto`): the model writes
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` after the project's tool prompt;
- forced decoding (`required` or a named tool): vLLM structured outputs constrain the whole
  output to JSON — a list of calls for `required`, one call for a named tool.

The grammar fixes keys (in schema order) and punctuation but leaves whitespace to the model
(bounded: at most one newline plus indentation between two tokens, app/formats/json_grammar.py),
and the model's whitespace varies between requests (one line, indent 2, indent 4). Forcing compact
JSON is no cure: the model then writes non-canonical token splits that no rendering predicts. So
a candidate is rendered in each style the model is seen to use (`STYLES`), and the proposer
follows whichever variant the model's own tokens agree with.
"""

from __future__ import annotations

import difflib
import functools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from app.formats.tool_formats import get_format
from app.formats.tool_formats.base import (
    ParsedCall,
    ParsedOutput,
    ToolFormat,
    arguments_obj,
    message_text,
    with_system_text,
)
from app.formats.tool_formats.hermes import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_PROMPT

# The free-decoding side of the hermes format, under the names the rest of the code uses;
# other formats: app/formats/tool_formats/.
_HERMES = get_format("hermes")

__all__ = [
    "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "TOOL_PROMPT", "ParsedCall", "ParsedOutput",
    "arguments_obj", "message_text", "with_system_text",
]


# ----- prompt ------------------------------------------------------------------------------
def tool_system_prompt(tools: list[dict[str, Any]]) -> str:
    return _HERMES.system_prompt(tools)


def prepare_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Messages the chat template can take: tools described in the system message, past
    assistant calls written in the model's format, tool results as `<tool_response>` turns."""
    return _HERMES.prepare_messages(messages, tools)


# ----- forced decoding ---------------------------------------------------------------------
def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_output_schema(
    tools: list[dict[str, Any]], named: str | None, parallel: bool = False
) -> dict[str, Any]:
    """JSON schema the main model's output is constrained to when a call is forced.

    Several calls only when the client asked for parallel calls explicitly: small models
    under a list grammar tend to repeat the same call until `max_tokens`."""
    if named is not None:
        tool = next(t for t in tools if t["function"]["name"] == named)
        return _call_schema(tool)
    calls = [_call_schema(t) for t in tools]
    item = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


# Whitespace styles of one call object: json.dumps keyword arguments.
STYLES: tuple[dict[str, Any], ...] = (
    {"indent": 4},
    {"indent": 2},
    {"indent": 0},  # one key per line, flush left
    {},  # one line, ", " and ": "
)


def _ordered_objects(calls: list[ParsedCall], tools: list[dict[str, Any]]) -> list[Any]:
    by_name = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    return [
        {"name": c.name, "arguments": order_like_schema(c.arguments, by_name.get(c.name, {}))}
        for c in calls
    ]


def render_forced(
    calls: list[ParsedCall], tools: list[dict[str, Any]], named: str | None,
    style: dict[str, Any] | None = None,
) -> str:
    """Text of `calls` under `forced_output_schema`, in one whitespace style."""
    objs = _ordered_objects(calls, tools)
    style = {} if style is None else style
    if named is not None:
        return json.dumps(objs[0], ensure_ascii=False, **style)
    if not style:
        return json.dumps(objs, ensure_ascii=False)
    # Seen from the model: list items flush left, each item in the style.
    items = ",\n".join(json.dumps(o, ensure_ascii=False, **style) for o in objs)
    return f"[\n{items}\n]"


def render_forced_variants(
    calls: list[ParsedCall], tools: list[dict[str, Any]], named: str | None
) -> list[str]:
    """The texts the main model may write for `calls`, one per whitespace style."""
    variants = [render_forced(calls, tools, named, style) for style in STYLES]
    if named is None:
        objs = _ordered_objects(calls, tools)
        items = ",\n".join(json.dumps(o, ensure_ascii=False) for o in objs)
        variants.append(f"[\n{items}\n]")
    return list(dict.fromkeys(variants))


def render_tagged_variants(
    fmt: ToolFormat, calls: list[ParsedCall], tools: list[dict[str, Any]]
) -> list[str]:
    """The texts the main model may write for `calls` when a structural tag forces them in
    its own format (app/formats/structural_tag.py): the format's own renderings, arguments in
    the schema's key order (the tag writes them so). For hermes, whose tag writes the JSON
    arguments with the model's whitespace (bounded), also each whitespace style of the
    arguments, with and without the newlines around the object (vLLM's hermes tag allows
    both), calls back to back."""
    ordered = [ParsedCall(o["name"], o["arguments"]) for o in _ordered_objects(calls, tools)]
    variants = fmt.render_variants(ordered)
    if fmt.vllm_parser in ("hermes", "qwen3_json"):
        for style in STYLES:
            for head, tail in (("\n", "\n"), ("", "")):
                variants.append("".join(
                    f'{TOOL_CALL_OPEN}{head}{{"name": "{c.name}", "arguments": '
                    f'{json.dumps(c.arguments, ensure_ascii=False, **style)}}}{tail}'
                    f'{TOOL_CALL_CLOSE}' for c in ordered))
    return list(dict.fromkeys(variants))


def placeholder_call(tool: dict[str, Any], alternate: bool = False) -> ParsedCall:
    """The tool's call with its required keys and a placeholder for every value.

    Drafted from the schema alone before any prediction arrives: the keys and punctuation
    are what the main model will write; a draft stops where a value begins (`value_stops`),
    and the proposer picks the text up again at the next key (see
    `alignment.candidate_remainder`). `alternate`: other placeholders for the scalar values
    (`value_stops` finds the values where the two renderings differ)."""
    return ParsedCall(
        tool["function"]["name"],
        placeholder_object(tool["function"].get("parameters") or {}, alternate),
    )


def placeholder_object(schema: dict[str, Any], alternate: bool = False) -> dict[str, Any]:
    """An object with the schema's required keys, in its order, and a placeholder value each."""
    required = set(schema.get("required") or [])
    props = schema.get("properties") or {}
    return {k: _placeholder(v, alternate) for k, v in props.items() if k in required}


@functools.lru_cache(maxsize=4096)
def value_stops(text: str, alternate: str) -> tuple[int, ...]:
    """Where in a placeholder rendering `text` the values begin that the schema does not fix:
    the offsets where it and the same call rendered with the alternate placeholders
    (`alternate`) part. Hand-written because no library knows which characters of a tool
    call's text a schema leaves open, in every format's own syntax; diffing two renderings
    asks the format itself.

    >>> value_stops('{"city": "", "unit": "c"}', '{"city": "x", "unit": "c"}')
    (10,)
    >>> value_stops('<parameter=n>\\n0\\n</parameter>', '<parameter=n>\\n1\\n</parameter>')
    (14,)
    """
    matcher = difflib.SequenceMatcher(None, text, alternate, autojunk=False)
    return tuple(sorted({i1 for tag, i1, _, _, _ in matcher.get_opcodes() if tag != "equal"}))


@dataclass(frozen=True)
class SchemaDraft:
    """A text drafted from a schema alone, and the offsets where its values begin: a draft
    from it stops there (the model writes the value itself)."""

    text: str
    stops: tuple[int, ...] = ()

    def behind(self, prefix: str) -> SchemaDraft:
        """The same draft written after `prefix` (its stops move with the text)."""
        return SchemaDraft(prefix + self.text, tuple(len(prefix) + at for at in self.stops))


def schema_drafts(texts: list[str], alternates: list[str]) -> list[SchemaDraft]:
    """The renderings of placeholder values (`texts`) with their `value_stops` against the
    same renderings with the alternate placeholders; no stops where the two do not pair up
    one to one."""
    if len(alternates) != len(texts):
        return [SchemaDraft(t) for t in texts]
    return [SchemaDraft(t, value_stops(t, a)) for t, a in zip(texts, alternates, strict=True)]


def render_json_variants(value: Any, schema: dict[str, Any]) -> list[str]:
    """The texts the model may write for `value` under a `response_format` schema, one per
    whitespace style (as `render_forced_variants` for a call)."""
    ordered = order_like_schema(value, schema)
    return list(dict.fromkeys(json.dumps(ordered, ensure_ascii=False, **s) for s in STYLES))


def _placeholder(schema: dict[str, Any], alternate: bool = False) -> Any:
    # An enum's first value stays in both renderings: often right, so drafted. Containers
    # too: two styles that render `[]` alike would render `[0]` apart, and the variants of
    # the two renderings must pair up.
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if alternate:
        return {"string": "x", "number": 1, "integer": 1, "boolean": True, "array": [],
                "object": {}}.get(str(kind), None)
    return {"string": "", "number": 0, "integer": 0, "boolean": False, "array": [],
            "object": {}}.get(str(kind), None)


def render_free(calls: list[ParsedCall]) -> str:
    """Text the model writes for `calls` when decoding freely with the tool prompt."""
    return _HERMES.render(calls)


def order_like_schema(value: Any, schema: dict[str, Any]) -> Any:
    """Order object keys as the schema lists them (grammar-constrained output does too)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        ordered = {k: order_like_schema(value[k], props.get(k, {})) for k in props if k in value}
        for k, v in value.items():
            if k not in ordered:
                ordered[k] = v
        return ordered
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [order_like_schema(v, items or {}) for v in value]
    return value


def parse_forced(text: str, named: str | None) -> ParsedOutput:
    data = json.loads(text)
    items = [data] if named is not None else data
    return ParsedOutput(
        content=None,
        calls=[ParsedCall(name=i["name"], arguments=i.get("arguments") or {}) for i in items],
    )


def parse_free(text: str) -> ParsedOutput:
    """Split free text into content and `<tool_call>` blocks; malformed blocks stay content."""
    return _HERMES.parse(text)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
