from app.sidecar import slot_filling as sf

PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer"},
        "detail": {"type": "boolean"},
    },
    "required": ["city", "days"],
}


def test_slots_all_or_required_in_schema_order() -> None:
    assert sf.slots(PARAMS) == ["city", "unit", "days", "detail"]
    assert sf.slots(PARAMS, optional=False) == ["city", "days"]


def test_draft_calls_with_and_without_optional_keys() -> None:
    filled = {"city": "Paris", "days": 3, "unit": "c"}
    drafts = sf.draft_calls("weather", PARAMS, filled)
    drafts += sf.draft_calls("noop", {"type": "object", "properties": {}}, {})
    assert [(d.name, d.arguments) for d in drafts] == [
        ("weather", {"city": "Paris", "days": 3}),
        ("weather", {"city": "Paris", "unit": "c", "days": 3}),
        ("noop", {}),
    ]
    # A required slot that failed: a placeholder of its type keeps the keys drafting.
    [draft] = sf.draft_calls("weather", PARAMS, {"city": "Paris"})
    assert draft.arguments == {"city": "Paris", "days": 0}
    assert sf.placeholder({"type": ["string", "null"]}) == ""
    assert sf.placeholder({"enum": ["c", "f"]}) == "c"


def test_the_call_with_optional_keys_leads_when_the_model_goes_on() -> None:
    params = {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}}}
    filled = {"city": "Paris", "days": 3, "unit": "c"}
    assert [d.arguments for d in sf.draft_calls("weather", params, filled, optional_first=True)
            ] == [filled, {"city": "Paris", "days": 3}]
    # Up to the end of the last required value, in the main model's style.
    text = sf.required_prefix("required", "weather", params, filled)
    assert text == ('[\n{\n    "name": "weather",\n    "arguments": {\n'
                    '        "city": "Paris",\n        "days": 3')
    assert sf.slot_prefix("required", "weather", "unit", before={"city": "Paris", "days": 3}
                          ).startswith(text + ",\n")
    assert sf.goes_on(",") and not sf.goes_on("\n   ")
    # No decision point: no optional keys, none required, an optional key first (keys come
    # in schema order), or a required value missing.
    assert sf.required_prefix("required", "w", {**params, "required": ["city", "days", "unit"]},
                              filled) is None
    assert sf.required_prefix("required", "w", {**params, "required": []}, filled) is None
    assert sf.required_prefix("required", "weather", PARAMS, filled) is None  # unit before days
    assert sf.required_prefix("required", "w", params, {"city": "Paris"}) is None


def test_common_prefix_len() -> None:
    assert sf.common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert sf.common_prefix_len([[5], [6]]) == 0
    assert sf.common_prefix_len([[1, 2]]) == 2
    assert sf.common_prefix_len([]) == 0


def test_numeric_slots_end_at_the_separator() -> None:
    assert sf.slot_regex(PARAMS, "days") is not None
    assert sf.slot_regex(PARAMS, "city") is None
    assert sf.parse_slot_value("42,", separated=True) == 42
    assert sf.parse_slot_value("42}", separated=True) == 42
    assert sf.parse_slot_value(' "Paris"') == "Paris"
    assert sf.parse_slot_value('{"a": 1}') == {"a": 1}
    assert sf.slot_prefix("required", "f", "city", space=False).endswith('"city":')


def test_names_regex_and_the_names_a_partial_name_can_still_be() -> None:
    names = ["get", "get_all", "put-item"]
    assert sf.names_regex(names) == r'(get|get_all|put\-item)"'
    assert sf.names_left(names, "ge") == ["get", "get_all"]
    assert sf.names_left(names, 'get"') == ["get"]  # a name that prefixes another, closed
    assert sf.names_left(names, "get_") == ["get_all"]
    assert sf.names_left(names, "x") == []


def test_signature_prompt_lists_typed_arguments_with_the_optional_ones_marked() -> None:
    text = sf.signature_prompt([{"type": "function", "function": {
        "name": "weather", "description": "Forecast", "parameters": PARAMS}}, {
        "type": "function", "function": {"name": "noop"}}])
    assert text.endswith(
        '\nweather(city: string, unit?: "c"|"f", days: integer, detail?: boolean) - Forecast'
        "\nnoop()"
    )
    assert sf.type_text({"type": "array", "items": {"type": "number"}}) == "array of number"
    assert sf.type_text({"type": ["string", "null"]}) == "string|null"


def test_slot_prefix_after_the_values_an_earlier_wave_found() -> None:
    assert sf.slot_prefix("named", "gcd", "b", before={"a": 40}) == (
        '{\n    "name": "gcd",\n    "arguments": {\n        "a": 40,\n        "b": '
    )


def test_the_names_listing_keeps_each_tools_name_and_description_only() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "description": "Forecast",
                                               "parameters": PARAMS, "strict": True}},
             {"type": "function", "function": {"name": "time"}}]
    assert sf.names_only(tools) == [
        {"type": "function", "function": {"name": "weather", "description": "Forecast"}},
        {"type": "function", "function": {"name": "time"}}]
    assert tools[0]["function"]["parameters"] is PARAMS  # the request's tools are untouched


def test_a_slot_filled_again_sees_the_required_values_before_it() -> None:
    values = {"city": "Oslo", "unit": "C", "days": 3, "detail": True}
    # Schema order city, unit, days, detail; city and days required: the optional unit is
    # left out, and nothing comes before the first key.
    assert sf.written_before(PARAMS, values, "detail") == {"city": "Oslo", "days": 3}
    assert sf.written_before(PARAMS, values, "days") == {"city": "Oslo"}
    assert sf.written_before(PARAMS, values, "city") == {}
    assert sf.written_before(PARAMS, {"days": 3}, "detail") == {"days": 3}  # city not filled


def test_repeated_values_are_the_ones_equal_to_an_earlier_argument() -> None:
    keys = ["a", "b", "c", "d", "e"]
    assert sf.repeated(keys, {"a": 40, "b": 40, "c": "x", "d": "x", "e": 40}) == ["b", "d", "e"]
    # Booleans, empty strings, containers and an int equal to a float are not copies.
    assert sf.repeated(keys, {"a": True, "b": True, "c": "", "d": "", "e": 1.0}) == []
    assert sf.repeated(["a", "b"], {"a": 1, "b": 1.0}) == []
    assert sf.repeated(["a", "b"], {"a": [1], "b": [1]}) == []


def test_free_string_slots_are_not_empty() -> None:
    assert sf.slot_schema(PARAMS, "city") == {"type": "string", "minLength": 1}
    assert sf.slot_schema(PARAMS, "unit") == {"type": "string", "enum": ["c", "f"]}
    pattern = {"properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}}
    assert "minLength" not in sf.slot_schema(pattern, "code")
