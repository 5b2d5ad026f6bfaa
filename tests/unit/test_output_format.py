"""`response_format` on chat requests: what is accepted, what is a 400, and the drafts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.api.errors import ApiError
from app.api.request_checks import parse_request
from app.config import LimitsConfig
from app.formats.tool_format import placeholder_object, render_json_variants

CITY = {"type": "object", "properties": {"name": {"type": "string"},
                                         "population": {"type": "integer"}},
        "required": ["name", "population"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def parse(**extra: Any) -> Any:
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    return parse_request(json.dumps(body).encode(), 1_000_000, LimitsConfig(), 2048)


def test_json_schema_and_json_object_give_the_output_schema() -> None:
    request = parse(response_format={"type": "json_schema", "json_schema": {
        "name": "City", "schema": CITY, "strict": True}})
    assert request.output_schema == CITY
    assert parse(response_format={"type": "json_object"}).output_schema == {"type": "object"}
    assert parse(response_format={"type": "text"}).output_schema is None


def test_the_schema_survives_the_payload_round_trip() -> None:
    # The router sends `model_dump(exclude_none=True)` to the main replica, which validates
    # it again: the `schema` alias must not get lost on the way.
    request = parse(response_format={"type": "json_schema", "json_schema": {"schema": CITY}})
    again = type(request).model_validate(request.model_dump(exclude_none=True))
    assert again.output_schema == CITY


@pytest.mark.parametrize("extra, words", [
    ({"response_format": {"type": "json_schema"}}, "needs a 'json_schema'"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     "not a valid JSON Schema"),
    ({"response_format": {"type": "json_object"}, "tools": [TOOL], "tool_choice": "required"},
     "cannot be combined"),
])
def test_bad_response_formats_are_400s(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(**extra)
    assert err.value.status == 400 and words in err.value.message, err.value.message


def test_schema_drafts_write_the_required_keys_in_every_style() -> None:
    variants = render_json_variants(placeholder_object(CITY), CITY)
    assert '{"name": "", "population": 0}' in variants
    assert '{\n  "name": "",\n  "population": 0\n}' in variants
    assert len(variants) == 4
