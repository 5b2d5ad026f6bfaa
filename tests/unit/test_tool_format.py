import json

from app.formats.tool_format import (
    ParsedCall,
    forced_output_schema,
    parse_forced,
    parse_free,
    placeholder_call,
    prepare_messages,
    render_forced,
    render_forced_variants,
    render_free,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"type": "string",
                                                              "enum": ["c", "f"]}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]


def test_render_forced_orders_keys_like_schema() -> None:
    text = render_forced([ParsedCall("get_weather", {"unit": "c", "city": "Paris"})], TOOLS, None)
    assert text == '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]'
    assert parse_forced(text, None).calls[0].arguments == {"city": "Paris", "unit": "c"}


def test_render_forced_named_is_one_object() -> None:
    text = render_forced([ParsedCall("add", {"b": 2, "a": 1})], TOOLS, "add")
    assert text == '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_forced(text, "add").calls == [ParsedCall("add", {"a": 1, "b": 2})]


def test_variants_cover_the_styles_the_model_writes() -> None:
    call = [ParsedCall("add", {"a": 1})]
    variants = render_forced_variants(call, TOOLS, None)
    # Seen from SmolLM2 under the grammar: items flush left in indent-4 and one-line styles.
    assert '[\n{\n    "name": "add",\n    "arguments": {\n        "a": 1\n    }\n}\n]' in variants
    assert '[\n{"name": "add", "arguments": {"a": 1}}\n]' in variants
    assert len(set(variants)) == len(variants)
    named = render_forced_variants(call, TOOLS, "add")
    assert '{\n  "name": "add",\n  "arguments": {\n    "a": 1\n  }\n}' in named


def test_placeholder_call_keeps_required_keys_in_order() -> None:
    call = placeholder_call(TOOLS[0])
    assert call == ParsedCall("get_weather", {"city": ""})
    enum_tool = {"type": "function", "function": {"name": "u", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "n": {"type": "integer"}},
        "required": ["unit", "n"]}}}
    assert placeholder_call(enum_tool).arguments == {"unit": "c", "n": 0}


def test_forced_schema_shapes() -> None:
    schema = forced_output_schema(TOOLS, None)
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert len(schema["items"]["anyOf"]) == 2
    named = forced_output_schema(TOOLS, "add")
    assert named["properties"]["name"] == {"const": "add"}


def test_free_round_trip_and_content() -> None:
    calls = [ParsedCall("add", {"a": 1, "b": 2}), ParsedCall("get_weather", {"city": "Oslo"})]
    parsed = parse_free("Let me check.\n" + render_free(calls))
    assert parsed.calls == calls
    assert parsed.content == "Let me check."


def test_free_text_without_calls_is_content() -> None:
    assert parse_free("hello").calls == []
    assert parse_free("<tool_call>{not json</tool_call>").content is not None


def test_prepare_messages_adds_tool_prompt_and_rewrites_history() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    out = prepare_messages(messages, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert "<tools>" in out[0]["content"] and '"get_weather"' in out[0]["content"]
    call = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
    assert out[2]["content"] == f"<tool_call>\n{call}\n</tool_call>"
    assert out[3] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
