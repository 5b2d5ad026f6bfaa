"""Request bodies for the fuzz tests, drawn from the request models' own JSON Schemas: valid by
the schema, then mutated the ways a hostile client would (a subtree replaced by odd JSON, a
key dropped or added, text a UTF-8 encoder refuses, number literals Python's `json` trips on,
duplicate keys), as the bytes that go on the wire.

`from_json_schema` compiles the subset of JSON Schema pydantic emits (`$ref` into `$defs`,
`anyOf`, `enum`, `const`, typed objects, arrays, strings with `pattern` and lengths, bounded
numbers) into Hypothesis strategies once, so a draw costs microseconds. hypothesis-jsonschema
would do the same in general but builds its strategies again on every draw (about 0.2 s a
body for the chat request) and its 0.23 release no longer runs on current Hypothesis. A free
object (`dict[str, Any]`: a tool's `parameters`, a content part, a Responses input item) is
drawn as arbitrary JSON, a schema-like object whose keywords hold values of any type (what
broke the work count, issue 39), a content part, or an input item.

Used in-process by tests/unit/test_body_fuzz.py and against the running app by
tests/e2e/test_fuzz.py.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

# Marks a value that `wire` writes as a literal json.dumps cannot (Python refuses to print an
# integer of more than 4,300 digits).
BIG_INT = "\x00big-int\x00"
BIG_INT_LITERAL = "9" * 5000

LONE_SURROGATES = ["\ud800", "a\udfffb", "\udbff", "x" * 10 + "\ud83d"]

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=16))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10,
)
# A value no well-formed request holds: text an encoder refuses, a number past what a field
# or Python's json takes, a deep or wide structure.
hostile = st.one_of(
    st.sampled_from(LONE_SURROGATES),
    st.just(BIG_INT),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 2**64, -(2**63) - 1, 10**90]),
    st.integers(1, 90).map(lambda depth: json.loads("[" * depth + "]" * depth)),
    st.sampled_from(["", "x" * 5000, "\x00", "\u202e", "{{", "%s", "\\ud800"]),
)

SCHEMA_WORDS = ["type", "properties", "items", "required", "enum", "const", "$ref", "$defs",
                "anyOf", "allOf", "oneOf", "not", "pattern", "patternProperties",
                "additionalProperties", "prefixItems", "minLength", "maxLength", "minimum",
                "maximum", "minItems", "maxItems", "format", "default", "if", "then", "else",
                "dependentSchemas", "$dynamicRef", "$id", "contains", "uniqueItems"]
TYPE_NAMES = ["object", "objectt", "string", "integer", "number", "boolean", "null", "array"]

schema_like = st.recursive(
    st.fixed_dictionaries({}, optional={"type": st.sampled_from(TYPE_NAMES) | json_values}),
    lambda inner: st.dictionaries(
        st.sampled_from(SCHEMA_WORDS),
        st.one_of(inner, json_values, st.lists(inner, max_size=3),
                  st.dictionaries(st.text(max_size=6), inner, max_size=3),
                  st.sampled_from(TYPE_NAMES), st.sampled_from(["#", "#/$defs/a", "(a|b)+",
                                                                "http://x/y"])),
        max_size=5),
    max_leaves=12,
)
content_parts = st.fixed_dictionaries(
    {}, optional={"type": st.sampled_from(["text", "input_text", "output_text", "refusal",
                                           "image_url"]) | json_values,
                  "text": st.text(max_size=12) | json_values,
                  "refusal": st.text(max_size=8) | json_values})
input_items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant"]),
                           "content": st.text(max_size=12) | st.lists(content_parts, max_size=3)},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.text(max_size=6),
                           "name": st.sampled_from(["lookup", "f"]),
                           "arguments": st.sampled_from(['{"key": "a"}', "{", "[]"])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"),
                           "call_id": st.text(max_size=6),
                           "output": st.text(max_size=12) | st.lists(content_parts, max_size=2)}),
    st.dictionaries(st.sampled_from(["type", "role", "content", "call_id", "output"]),
                    json_values, max_size=3),
)
free_objects = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    schema_like, content_parts, input_items,
)


# Schemas a client would write, beside `schema_like`'s odd ones.
good_schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean"])},
                          optional={"enum": st.lists(st.text(max_size=4), min_size=1,
                                                     max_size=3),
                                    "maxLength": st.integers(0, 8),
                                    "pattern": st.sampled_from(["^a+$", "[0-9]{2}", "(a|b)*c"]),
                                    "minimum": st.integers(-5, 5)}),
    lambda inner: st.builds(
        lambda props, required: {"type": "object", "properties": props,
                                 "required": [k for k in props if k in required]},
        st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, max_size=4),
        st.sets(st.from_regex(r"[a-z]{1,6}", fullmatch=True), max_size=3))
    | st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
    max_leaves=6,
)
# A tool's object schema whose `properties` or `required` hold anything (issue 39's
# `{"type": "objectt", "properties": 5}`): what reads a schema before it is validated trips.
odd_object_schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "objectt"])},
    optional={"properties": json_values | st.dictionaries(st.text(max_size=4), schema_like,
                                                          max_size=3),
              "required": json_values | st.lists(st.text(max_size=4), max_size=3)})
names = st.sampled_from(["lookup", "get_weather", "f", "x"])
tool_defs = st.lists(st.builds(
    lambda name, params, description: {"type": "function", "function": {
        "name": name, "parameters": params, **({"description": description}
                                               if description is not None else {})}},
    names, good_schemas | schema_like | odd_object_schemas, st.none() | st.text(max_size=12)),
    min_size=1, max_size=3, unique_by=lambda tool: tool["function"]["name"])
tools = st.just([]) | tool_defs
tool_choices = (st.sampled_from(["auto", "none", "required"])
                | names.map(lambda n: {"type": "function", "function": {"name": n}}))
output_formats = st.one_of(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    st.builds(lambda schema: {"type": "json_schema", "json_schema": {"name": "r",
                                                                     "schema": schema}},
              good_schemas | schema_like))
texts = st.text(max_size=24)
chat_messages = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer"]),
                           "content": texts | st.lists(content_parts, max_size=3)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | texts},
                          optional={"tool_calls": st.lists(st.fixed_dictionaries({
                              "id": st.text(max_size=4), "type": st.just("function"),
                              "function": st.fixed_dictionaries({
                                  "name": names, "arguments": st.sampled_from(
                                      ['{"key": "a"}', "{", "[]", ""])})}), max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.text(min_size=1,
                                                                            max_size=4),
                           "content": texts}),
)


@st.composite
def forced_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A chat request that forces a tool call (the sidecar's slots count the tool's
    properties), with any of `tool_defs`' schemas."""
    offered = draw(tool_defs)
    choice = draw(st.sampled_from(["required", "named"]))
    return {"messages": draw(st.lists(chat_messages, min_size=1, max_size=2)), "tools": offered,
            "tool_choice": choice if choice == "required" else {
                "type": "function", "function": {"name": offered[0]["function"]["name"]}},
            "max_tokens": draw(st.integers(1, 64))}


sampling = {"max_tokens": st.integers(1, 64), "temperature": st.floats(0, 2),
            "seed": st.integers(-(2**63), 2**63 - 1), "stream": st.booleans(),
            "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2)}
# Bodies the models take (most of the time), so mutations reach the checks after the parse.
TYPICAL: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/v1/chat/completions": forced_calls() | st.fixed_dictionaries(
        {"messages": st.lists(chat_messages, min_size=1, max_size=3)},
        optional={"tools": tools, "tool_choice": tool_choices,
                  "response_format": output_formats, "n": st.integers(1, 3),
                  "parallel_tool_calls": st.booleans(), **sampling}),
    "/v1/completions": st.fixed_dictionaries(
        {"prompt": texts | st.lists(texts, min_size=1, max_size=3)
         | st.lists(st.integers(0, 50_000), min_size=1, max_size=4)},
        optional={"response_format": output_formats, "n": st.integers(1, 3),
                  "logprobs": st.integers(0, 5), **sampling}),
    "/v1/responses": st.fixed_dictionaries(
        {"input": texts | st.lists(input_items, min_size=1, max_size=3)},
        optional={"instructions": texts,
                  "tools": tools.map(lambda ts: [{"type": "function", **t["function"]}
                                                 for t in ts]),
                  "tool_choice": st.sampled_from(["auto", "none", "required"]),
                  "text": output_formats.map(lambda f: {"format": {
                      "type": f["type"], **({"name": "r", "schema": f["json_schema"]["schema"]}
                                            if "json_schema" in f else {})}}),
                  "max_output_tokens": st.integers(1, 64), "stream": st.booleans()}),
}


def from_json_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid by `schema`, one of pydantic's `model_json_schema()`."""
    defs: dict[str, Any] = schema.get("$defs", {})
    compiled: dict[str, st.SearchStrategy[Any]] = {}

    def ref(name: str) -> st.SearchStrategy[Any]:
        if name not in compiled:
            compiled[name] = st.deferred(lambda: build(defs[name]))
        return compiled[name]

    def build(node: dict[str, Any]) -> st.SearchStrategy[Any]:
        if "$ref" in node:
            return ref(node["$ref"].rsplit("/", 1)[-1])
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        for word in ("anyOf", "oneOf", "allOf"):  # pydantic's allOf has one entry
            if word in node:
                return st.one_of([build(option) for option in node[word]])
        kind = node.get("type")
        if kind == "object":
            return objects(node)
        if kind == "array":
            return st.lists(build(node.get("items", {})), min_size=node.get("minItems", 0),
                            max_size=max(node.get("minItems", 0), 3))
        if kind == "string":
            if "pattern" in node:
                return st.from_regex(node["pattern"], fullmatch=True)
            least = node.get("minLength", 0)
            return st.text(min_size=least, max_size=min(node.get("maxLength", 24), least + 24))
        if kind == "integer":
            low = node.get("minimum", node.get("exclusiveMinimum", -(2**64) - 1) + 1)
            return st.integers(low, node.get("maximum", 2**64 + 1))
        if kind == "number":
            return st.floats(node.get("minimum", node.get("exclusiveMinimum")),
                             node.get("maximum"), allow_nan=False, allow_infinity=False,
                             exclude_min="exclusiveMinimum" in node)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return json_values  # `Any`

    def objects(node: dict[str, Any]) -> st.SearchStrategy[Any]:
        properties = node.get("properties", {})
        extra = node.get("additionalProperties", not properties)
        if not properties:
            if extra is True:
                return free_objects
            return st.dictionaries(st.text(max_size=8), build(extra) if extra else st.none(),
                                   max_size=3 if extra else 0)
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {k: build(v) for k, v in properties.items() if k in required},
            optional={k: build(v) for k, v in properties.items() if k not in required})

    return build(schema)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A body from `valid`, then one mutation at any depth: a value replaced by odd or
    hostile JSON, a key dropped, a key added; or left as it is."""
    body = copy.deepcopy(draw(valid))  # strategies may hand out shared objects
    action = draw(st.sampled_from(["keep", "replace", "hostile", "drop", "add"]))
    if action == "keep":
        return body
    # Walk down to a random container, then mutate one of its entries.
    node: Any = body
    while True:
        children = (list(node.items()) if isinstance(node, dict)
                    else list(enumerate(node)) if isinstance(node, list) else [])
        nested = [(k, v) for k, v in children if isinstance(v, dict | list) and v]
        if not nested or draw(st.booleans()):
            break
        node = draw(st.sampled_from(nested))[1]
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    if action == "add" and isinstance(node, dict):
        node[draw(st.text(min_size=1, max_size=10) | st.sampled_from(LONE_SURROGATES))] = \
            draw(json_values | hostile)
    elif action == "drop" and keys:
        node.pop(draw(st.sampled_from(keys)))
    elif keys:
        node[draw(st.sampled_from(keys))] = draw(hostile if action == "hostile"
                                                 else json_values | free_objects)
    return body


_DROP = object()
# What `variants` puts in place of a value: odd types, hostile text and numbers, shapes that
# belong elsewhere in a request, or nothing (the key dropped).
REPLACEMENTS: list[Any] = [
    "\ud800", "a\udfffb", BIG_INT, float("nan"), float("inf"), 2**64, -1, 0, 1.5, True, None,
    "", "x" * 5000, [], {}, [[[[]]]], {"type": "objectt", "properties": 5},
    {"type": "text"}, [{"type": "text"}], [{"type": "text", "text": None}], _DROP,
]


def _places(body: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in `body`."""
    places: list[tuple[Any, Any]] = []
    stack = [body]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(
            node, list) else []
        for key in keys:
            places.append((node, key))
            stack.append(node[key])
    return places


def variants(body: Any, count: int, rng: random.Random) -> list[bytes]:
    """`count` wire bodies, each `body` with one value replaced from `REPLACEMENTS` (or
    dropped): many bodies for the cost of drawing one."""
    places = _places(body)
    out: list[bytes] = []
    for _ in range(count if places else 0):
        node, key = rng.choice(places)
        new = rng.choice(REPLACEMENTS)
        old = node[key]
        if new is _DROP:
            del node[key]
            out.append(wire(body))
            if isinstance(node, list):
                node.insert(key, old)
            else:
                node[key] = old
        else:
            node[key] = new
            out.append(wire(body))
            node[key] = old
    return out


def wire(value: Any, duplicate_key: bool = False) -> bytes:
    """`value` as a request body: `json.dumps` (which writes NaN and Infinity as Python does,
    and a lone surrogate as its escape), `BIG_INT` as a 5,000-digit literal, and with
    `duplicate_key` the first key of the body written twice."""
    text = json.dumps(value)
    text = text.replace(json.dumps(BIG_INT), BIG_INT_LITERAL)
    if duplicate_key and isinstance(value, dict) and value:
        first = json.dumps(next(iter(value)))
        text = "{" + first + ": null, " + text[1:]
    return text.encode()


@st.composite
def bodies(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]],
           finish: Callable[[Any], Any] = lambda body: body) -> bytes:
    """A wire body for one route: mostly a mutated valid one (6 in 9), else one with a
    duplicate key, arbitrary JSON, or arbitrary bytes. `finish` sees each mutated body before
    it is written (to keep generations short against a running app)."""
    kind = draw(st.integers(0, 8))
    if kind < 6:
        return wire(finish(draw(mutated(valid))))
    if kind == 6:
        return wire(finish(draw(mutated(valid))), duplicate_key=True)
    if kind == 7:
        return wire(draw(json_values))
    return draw(st.binary(max_size=48))


@st.composite
def batches(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]],
            size: int = 10) -> list[bytes]:
    """`size` wire bodies for the cost of drawing one: a valid body, the same mutated and with
    a duplicate key, arbitrary JSON or bytes, and `size - 4` `variants` of the valid body
    (each one fault in a body that is otherwise valid, so most reach the checks past the
    parse)."""
    body = copy.deepcopy(draw(valid))
    odd = draw(json_values.map(wire) | st.binary(max_size=48))
    first = [wire(body), wire(draw(mutated(st.just(body)))), wire(body, duplicate_key=True), odd]
    # Seeded from the draw (reproducible), but not steered by Hypothesis, whose choices lean
    # towards the first of a list.
    rng = random.Random(draw(st.integers(0, 2**32)))
    return first + variants(body, size - len(first), rng)
