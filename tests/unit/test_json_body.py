"""The strict JSON parse of a request body (app/api/json_body.py) and the error envelope that
can always be sent (app/api/errors.py): every case a 400 that names the field."""

from __future__ import annotations

import json

import pytest

from app.api.errors import ApiError, error_body
from app.api.json_body import MAX_INT_DIGITS, check_text, loads_strict, unencodable_text


def refused(body: str | bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        loads_strict(body)
    assert caught.value.status == 400
    return caught.value


def test_integers_past_the_digit_limit_are_refused_where_they_are() -> None:
    assert loads_strict('{"seed": %s}' % ("9" * MAX_INT_DIGITS)) == {
        "seed": int("9" * MAX_INT_DIGITS)}
    assert loads_strict('{"seed": -%s}' % ("9" * MAX_INT_DIGITS))["seed"] < 0
    err = refused('{"seed": %s}' % ("9" * (MAX_INT_DIGITS + 1)))
    assert err.code == "number_too_long" and err.param == "seed"
    # Past Python's own limit (4,300 digits), json.loads raises a bare ValueError.
    err = refused('{"a": [1, {"max_tokens": %s}]}' % ("1" * 5000))
    assert err.param == "a[1].max_tokens" and "5000 digits" in err.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_numbers_json_does_not_have_are_refused(literal: str) -> None:
    err = refused(f'{{"temperature": {literal}}}')
    assert err.param == "temperature"
    assert err.code in ("invalid_number", "number_too_large")
    assert loads_strict('{"temperature": 1e300}') == {"temperature": 1e300}


def test_a_key_twice_in_one_object_is_refused() -> None:
    err = refused('{"messages": [{"role": "user", "role": "system", "content": "x"}]}')
    assert err.code == "duplicate_key" and err.param == "messages[0]" and "'role'" in err.message
    top = refused('{"seed": 1, "n": 2, "seed": 2}')
    assert top.param is None and "request body" in top.message
    # The same key in two objects is fine.
    assert loads_strict('{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}


def test_the_first_refused_value_in_document_order_is_named() -> None:
    err = refused('{"a": NaN, "b": [%s]}' % ("7" * 200))
    assert err.param == "a"


@pytest.mark.parametrize("body", [b'{"a": [', b"\xff\xfe\xfd", b"",
                                  b"[" * 100_000, b'{"a": 1} x'])
def test_bad_json_is_a_400(body: bytes) -> None:
    refused(body)


def test_text_that_cannot_be_encoded_is_found_with_its_path() -> None:
    data = json.loads('{"messages": [{"role": "user", "content": [{"type": "text", '
                      '"text": "ok"}, {"type": "text", "text": "a\\ud800"}]}]}')
    assert unencodable_text(data) == "messages[0].content[1].text"
    assert unencodable_text(json.loads('{"tools": {"\\udfff": 1}}')) == "tools[key]"
    assert unencodable_text(json.loads('"\\udbff"')) == "body"
    # A surrogate pair is one character, and fine.
    assert unencodable_text(json.loads('{"a": "\\ud83d\\ude00", "b": [1, null]}')) is None
    deep: object = "\ud800"
    for _ in range(5000):  # iterative: any depth
        deep = [deep]
    assert unencodable_text(deep) == "[0]" * 5000
    # Python's json decodes a surrogate's UTF-8 bytes too (with "surrogatepass").
    assert unencodable_text(loads_strict(b'{"a": "\xed\xa0\x80"}')) == "a"
    with pytest.raises(ApiError) as caught:
        check_text({"prompt": "x\ud800"})
    assert caught.value.param == "prompt" and caught.value.code == "invalid_text"


def test_an_error_that_quotes_a_lone_surrogate_can_still_be_sent() -> None:
    body = error_body(400, "tool 'a\ud800' is odd", "tools.\udfff")
    encoded = json.dumps(body, ensure_ascii=False).encode()  # what a JSON response does
    assert b"\\ud800" in encoded and b"\\udfff" in encoded
