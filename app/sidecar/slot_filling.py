"""Parallel slot filling: the fast sidecar's plan for one request.

Instead of writing the whole invocation (as slow as the main model when both are small), the
sidecar predicts every argument as its own short generation, all submitted together so the
engine batches them and shares the prompt prefix. Each slot's prompt continues the invocation
in the main model's own style, and each slot ends by its own grammar (the JSON value of that
argument), so no slot rambles. The tool is chosen before, by generating its name under the
names' grammar (`names_regex`, `names_left`). The prompt lists the tools as one-line signatures
(`signature_prompt`): the sidecar's time is mostly its prompt's prefill. A later wave fills
each argument again after the values found before it (`slot_prefix(before=...)`). The calls the
slots make (`draft_calls`) are the prediction, led by the one with the optional keys when one
more token after the required values says the call goes on (`required_prefix`); optionally
(`sidecar.verify`) they draft one verifying pass of the whole call, which fixes the values that
depend on each other and keeps the optional keys the model writes.

Pure: builds prompts' text tails and schemas, assembles the answer; the engine lives elsewhere.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.speculation.prediction import PredictedCall
from app.speculation.tool_union import grammar_safe_schema

INDENT = "    "


SIGNATURE_PROMPT = "You are a function calling AI model. Available functions:\n{tools}"


def signature_prompt(tools: list[dict[str, Any]]) -> str:
    """The sidecar's system prompt: one line per tool, `name(arg: type, opt?: type) - what
    it does`. Under a third of the tokens of the main model's JSON listing (median 29% on
    BFCL `simple_python` and `multiple`), and the sidecar's time is mostly the prefill of its
    prompt (the same model on the same kind of core); the argument values come from the
    conversation, which the prompt keeps whole."""
    return SIGNATURE_PROMPT.format(tools="\n".join(signature(t["function"]) for t in tools))


def names_only(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools without their parameters (`sidecar.choice_prompt: names`): what the main
    model's listing says to choose a tool by, in its own format, at about half its length."""
    out = []
    for tool in tools:
        function = tool["function"]
        kept = {"name": function["name"]}
        if function.get("description"):
            kept["description"] = function["description"]
        out.append({"type": "function", "function": kept})
    return out


def signature(function: dict[str, Any]) -> str:
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    args = ", ".join(
        f"{key}{'' if key in required else '?'}: {type_text(schema)}"
        for key, schema in (parameters.get("properties") or {}).items()
    )
    description = function.get("description")
    return f"{function['name']}({args})" + (f" - {description}" if description else "")


def type_text(schema: Any) -> str:
    """A short type: the enum's values when there is one, else the JSON type."""
    if not isinstance(schema, dict):
        return "any"
    if schema.get("enum"):
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {type_text(schema['items'])}"
    return "|".join(kind) if isinstance(kind, list) else str(kind)


def name_prefix(mode: str) -> str:
    """The main model's output up to the tool name (indent-4 style, the one most seen)."""
    opening = "{" if mode == "named" else "[\n{"
    return f'{opening}\n{INDENT}"name": "'


def slot_prefix(
    mode: str, tool_name: str, key: str, space: bool = True, before: dict[str, Any] | None = None
) -> str:
    """The main model's output up to the value of argument `key`, after the arguments
    `before` (a later wave: the values an earlier one found). `space=False` stops before
    the space after the colon: the tokenizer glues that space to the value's first token
    (` "`), and a prompt ending in a bare space token sends the model off into garbage
    strings; the value's JSON grammar then takes the space itself."""
    written = "".join(
        f'{INDENT * 2}"{k}": {json.dumps(v, ensure_ascii=False)},\n'
        for k, v in (before or {}).items()
    )
    return (
        f'{name_prefix(mode)}{tool_name}",\n{INDENT}"arguments": {{\n{written}{INDENT * 2}"{key}":'
        + (" " if space else "")
    )


# The token after an argument's value: a comma (another key follows) or the newline and
# indentation before the closing brace. One token is generated under it (`writes_optional`).
AFTER_VALUE_REGEX = r"(,|\n[ ]*)"


def required_prefix(
    mode: str, tool_name: str, parameters: dict[str, Any], filled: dict[str, Any]
) -> str | None:
    """The main model's output up to the end of the last required value (written from
    `filled`), where it either goes on with the optional keys or closes the call; None when
    there is no such point: no optional or no required keys, an optional key before a
    required one (the model writes keys in schema order), or a required value missing."""
    keys = slots(parameters)
    required = set(parameters.get("required") or [])
    head = [k for k in keys if k in required]
    if not head or len(head) == len(keys) or keys[: len(head)] != head:
        return None
    if any(k not in filled for k in head):
        return None
    written = ",\n".join(
        f'{INDENT * 2}"{k}": {json.dumps(filled[k], ensure_ascii=False)}' for k in head
    )
    return f'{name_prefix(mode)}{tool_name}",\n{INDENT}"arguments": {{\n{written}'


def goes_on(text: str) -> bool:
    """Whether the token generated after `required_prefix` continues the call (a comma)."""
    return text.startswith(",")


def slots(parameters: dict[str, Any], optional: bool = True) -> list[str]:
    """Argument slots to predict, in schema order: every property (optional ones too: their
    values are filled beside the required ones; whether the model writes them is left to the
    verifying pass), or only the required ones."""
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    return [key for key in properties if optional or key in required]


def written_before(parameters: dict[str, Any], values: dict[str, Any], key: str) -> dict[str, Any]:
    """The values written before argument `key` when it is filled again (`sidecar.waves`,
    `refill_repeats`): the required ones before it in schema order that have a value. The
    optional ones are left out: whether the model writes them is decided after the required
    values (`required_prefix`)."""
    keys = slots(parameters)
    required = set(parameters.get("required") or [])
    return {b: values[b] for b in keys[: keys.index(key)] if b in required and b in values}


def draft_calls(
    name: str, parameters: dict[str, Any], filled: dict[str, Any], optional_first: bool = False
) -> list[PredictedCall]:
    """The calls tool `name`'s filled slots make: the required keys alone, then every filled
    key (optional ones included) when there are optional ones; that one first with
    `optional_first`. A required slot left unfilled (cut short by its budget) gets a
    placeholder of its type. Drafts, not answers: the verifying pass writes its own value
    where a draft's is wrong, and keeps the optional keys the model does write."""
    required = set(parameters.get("required") or [])
    properties = parameters.get("properties") or {}
    arguments = {
        k: filled[k] if k in filled else placeholder(properties[k])
        for k in slots(parameters) if k in filled or k in required
    }
    # The required keys alone first: the call the main model most often writes.
    bare = {k: v for k, v in arguments.items() if k in required}
    drafts = [PredictedCall(name=name, arguments=bare)]
    if bare != arguments:
        full = PredictedCall(name=name, arguments=arguments)
        drafts = [full, *drafts] if optional_first else [*drafts, full]
    return drafts


def placeholder(schema: dict[str, Any]) -> Any:
    """A value of the schema's type, for a slot that did not fill (its keys still draft)."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    return {"integer": 0, "number": 0, "boolean": False, "array": [], "object": {},
            "null": None}.get(str(kind), "")


def repeated(keys: list[str], values: dict[str, Any]) -> list[str]:
    """Keys whose value (a number or a non-empty string) equals an earlier key's value."""
    seen: list[Any] = []
    out: list[str] = []
    for key in keys:
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float | str) or value == "":
            continue
        if any(type(v) is type(value) and v == value for v in seen):
            out.append(key)
        seen.append(value)
    return out


def names_regex(names: list[str]) -> str:
    """The grammar of a tool name and its closing quote, as the forced call writes it."""
    return "(" + "|".join(re.escape(n) for n in names) + ')"'


def names_left(names: list[str], text: str) -> list[str]:
    """The names a partly written name (`text`, maybe with its closing quote) can still be."""
    return [n for n in names if (n + '"').startswith(text) or text.startswith(n + '"')]


def common_prefix_len(sequences: list[list[int]]) -> int:
    """Length of the token prefix all `sequences` share."""
    if not sequences:
        return 0
    size = min(len(s) for s in sequences)
    for i in range(size):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return size


# A JSON number never ends by its own grammar (one more digit is always allowed), and a small
# model then writes digits until its budget runs out. So numbers are generated by a regex that
# ends at the separator the main model writes after a value, which the model does want to write.
_INTEGER = r"-?(0|[1-9][0-9]{0,17})"
_NUMBER = _INTEGER + r"(\.[0-9]{1,12})?([eE][-+]?[0-9]{1,3})?"
VALUE_END = ",\n}"


def slot_regex(parameters: dict[str, Any], key: str) -> str | None:
    """A regex for numeric slots (value + one separator), None for every other slot."""
    schema = (parameters.get("properties") or {}).get(key) or {}
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        return None
    # The separator as an escaped alternative: xgrammar rejects a raw newline in a class.
    end = r"(,|\n|\})"
    if kind == "integer":
        return _INTEGER + end
    if kind == "number":
        return _NUMBER + end
    return None


def parse_slot_value(text: str, separated: bool = False) -> Any:
    """The JSON value of a slot's output; a regex slot (`separated`) ends with its separator,
    a JSON-grammar slot with the value itself (which may well end in `}`)."""
    return json.loads(text[:-1] if separated and text[-1:] in VALUE_END else text)


def slot_schema(parameters: dict[str, Any], key: str) -> dict[str, Any]:
    """The grammar of one argument's value; keeps `$defs` so local `$ref`s still resolve."""
    schema = dict((parameters.get("properties") or {}).get(key) or {})
    if not schema:
        schema = {}
    defs = parameters.get("$defs") or parameters.get("definitions")
    if defs and ("$ref" in str(schema)):
        schema = {**schema, "$defs": defs}
    safe = grammar_safe_schema(schema)
    if not safe:
        return {"type": ["string", "number", "integer", "boolean", "null"]}
    if safe.get("type") == "string" and not {"enum", "const", "pattern", "minLength"} & set(safe):
        # Given only the key, a small model often closes the string at once; the main model,
        # which has written the call up to here, almost never writes an empty one.
        safe = {**safe, "minLength": 1}
    return safe
