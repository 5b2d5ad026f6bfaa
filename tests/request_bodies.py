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

import json
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
input_items = st.fixed_dictionaries(
    {}, optional={"type": st.sampled_from(["message", "function_call", "function_call_output",
                                           "reasoning"]),
                  "role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]),
                  "content": st.text(max_size=12) | st.lists(content_parts, max_size=3),
                  "call_id": st.text(max_size=6), "name": st.sampled_from(["lookup", "f"]),
                  "arguments": st.sampled_from(['{"key": "a"}', "{", "[]"]),
                  "output": st.text(max_size=12) | st.lists(content_parts, max_size=2)})
free_objects = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    schema_like, content_parts, input_items,
)


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
        if "anyOf" in node:
            return st.one_of([build(option) for option in node["anyOf"]])
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
    body = draw(valid)
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


def bodies(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """Wire bodies for one route: mostly mutated valid ones, some with a duplicate key, some
    arbitrary JSON, some arbitrary bytes."""
    return st.one_of(
        mutated(valid).map(wire),
        mutated(valid).map(lambda value: wire(value, duplicate_key=True)),
        json_values.map(wire),
        st.binary(max_size=48),
    )
