"""BFCL v4 loading, schema conversion and scoring (load_tests.bfcl).

The first run downloads the pinned bfcl-eval wheel with `pip download --no-deps` into the
dataset cache (`$OOO_SPEC_HOME/datasets`); later runs read it from there.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.speculation.canonical import Invocation
from app.speculation.tool_union import invocation_union_schema
from app.speculation.validation import check_schema, validate_arguments
from load_tests.bfcl import (
    CORE_CATEGORIES,
    BfclCase,
    convert_bfcl_schema,
    load_bfcl,
    ooo_spec_home,
    openai_names,
    score_call,
    score_calls,
)

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.fixture(scope="module")
def cases() -> dict[str, list[BfclCase]]:
    return {category: load_bfcl(category) for category in CORE_CATEGORIES}


def test_case_counts(cases: dict[str, list[BfclCase]]) -> None:
    assert {c: len(v) for c, v in cases.items()} == {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
    }
    assert len(load_bfcl("parallel", limit=7)) == 7


def test_every_converted_schema_and_union_is_valid(cases: dict[str, list[BfclCase]]) -> None:
    for group in cases.values():
        for index, case in enumerate(group):
            for tool in case.tools:
                assert check_schema(tool["function"]["parameters"]) is None, (case.id, tool)
            # The widest union (every branch kind) for all cases; the narrowest for a sample,
            # since a metaschema check of a union costs ~10 ms.
            variants = [(True, True), (False, False)] if index < 25 else [(True, True)]
            for no_call, parallel in variants:
                union = invocation_union_schema(case.tools, no_call, parallel)
                assert check_schema(union, tool_parameters=False) is None, case.id


def test_names_are_openai_valid_and_map_back(cases: dict[str, list[BfclCase]]) -> None:
    for case in (case for group in cases.values() for case in group):
        names = [tool["function"]["name"] for tool in case.tools]
        assert all(OPENAI_NAME.match(name) for name in names)
        assert sorted(case.bfcl_names) == sorted(names)
        for entry in case.ground_truth:
            assert set(entry) <= set(names), case.id
    multiple_0 = cases["multiple"][0]
    assert multiple_0.bfcl_names["triangle_properties_get"] == "triangle_properties.get"


def test_first_case_is_an_openai_request(cases: dict[str, list[BfclCase]]) -> None:
    case = cases["simple_python"][0]
    assert case.id == "simple_python_0"
    assert case.messages == [
        {
            "role": "user",
            "content": "Find the area of a triangle with a base of 10 units and height of 5 units.",
        }
    ]
    assert case.tools[0]["type"] == "function"
    assert case.tools[0]["function"]["parameters"]["type"] == "object"
    assert case.ground_truth == [
        {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}
    ]


def test_invalid_defaults_are_dropped_and_counted(cases: dict[str, list[BfclCase]]) -> None:
    dropped = {c: sum(len(case.dropped_defaults) for case in v) for c, v in cases.items()}
    assert dropped == {"simple_python": 5, "multiple": 11, "parallel": 5, "parallel_multiple": 2}
    case = cases["simple_python"][55]
    assert case.dropped_defaults == ["biology_get_cell_info.detailed"]  # "false" for a boolean
    for case in (case for group in cases.values() for case in group):
        for tool in case.tools:
            schema = tool["function"]["parameters"]
            for name, prop in schema["properties"].items():
                if "default" in prop:
                    bare = {k: v for k, v in prop.items() if k != "default"}
                    assert validate_arguments(prop["default"], bare) == [], (case.id, name)


def _first_acceptable(option: Any) -> Any:
    """A concrete value from a ground-truth option (nested dict specs hold lists of options)."""
    if isinstance(option, dict):
        return {
            key: _first_acceptable(next(v for v in values if v != ""))
            for key, values in option.items()
            if any(v != "" for v in values)
        }
    if isinstance(option, list):
        return [_first_acceptable(item) for item in option]
    return option


def _ground_truth_calls(case: BfclCase) -> list[Invocation]:
    calls = []
    for entry in case.ground_truth:
        ((name, params),) = entry.items()
        arguments = {
            param: _first_acceptable(next(v for v in values if v != ""))
            for param, values in params.items()
            if any(v != "" for v in values)
        }
        calls.append(Invocation(name=name, arguments=arguments))
    return calls


def test_ground_truth_scores_as_correct(cases: dict[str, list[BfclCase]]) -> None:
    failing = set()
    for case in (case for group in cases.values() for case in group):
        calls = _ground_truth_calls(case)
        if not all(score_call(call.name, call.arguments, case) for call in calls):
            failing.add(case.id)
        assert score_calls(list(reversed(calls)), case) == (case.id not in failing)
    # Their ground truth names a parameter the function does not declare; BFCL's checker
    # rejects such a call as well ("Unexpected parameter").
    assert failing == {"parallel_multiple_12", "parallel_multiple_26"}


def test_score_call_follows_bfcl_rules(cases: dict[str, list[BfclCase]]) -> None:
    case = cases["simple_python"][0]  # base [10], height [5], unit ["units", ""]
    assert score_call("calculate_triangle_area", {"base": 10, "height": 5}, case)
    assert score_call("calculate_triangle_area", {"base": 10.0, "height": 5, "unit": "Units"}, case)
    assert not score_call("calculate_triangle_area", {"base": 10, "height": 6}, case)
    assert not score_call("calculate_triangle_area", {"base": 10}, case)  # required missing
    assert not score_call(
        "calculate_triangle_area", {"base": 10, "height": 5, "colour": "red"}, case
    )
    assert not score_call("calculate_triangle_area", {"base": True, "height": 5}, case)
    assert not score_call("calculate_area", {"base": 10, "height": 5}, case)


def test_score_call_standardises_strings_and_accepts_bfcl_names(
    cases: dict[str, list[BfclCase]],
) -> None:
    case = cases["parallel"][0]  # spotify.play: Taylor Swift / 20, Maroon 5 / 15
    assert score_call("spotify_play", {"artist": "taylor swift", "duration": 20}, case)
    assert score_call("spotify.play", {"artist": "Maroon-5", "duration": 15}, case)
    assert not score_call("spotify_play", {"artist": "Maroon 5", "duration": 20}, case)
    both = [
        Invocation(name="spotify_play", arguments={"artist": "Maroon 5", "duration": 15}),
        Invocation(name="spotify_play", arguments={"artist": "Taylor Swift", "duration": 20}),
    ]
    assert score_calls(both, case)
    assert not score_calls(both[:1], case)
    assert not score_calls([both[0], both[0]], case)


def test_nested_dict_and_list_answers() -> None:
    case = BfclCase(
        id="t",
        category="synthetic",
        messages=[],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {
                        "type": "object",
                        "properties": {"pop": {"type": "object"}, "xs": {"type": "array"}},
                        "required": ["pop"],
                    },
                },
            }
        ],
        ground_truth=[{"f": {"pop": [{"adults": [2], "kids": [0, ""]}], "xs": [["a", "b"], ""]}}],
        bfcl_names={"f": "f"},
    )
    assert score_call("f", {"pop": {"adults": 2}}, case)
    assert score_call("f", {"pop": {"adults": 2.0, "kids": 0}, "xs": ["A", "b"]}, case)
    assert not score_call("f", {"pop": {"adults": 2, "pets": 1}}, case)
    assert not score_call("f", {"pop": {"kids": 0}}, case)
    assert not score_call("f", {"pop": {"adults": 2}, "xs": ["b", "a"]}, case)


def test_convert_bfcl_schema() -> None:
    bfcl = {
        "type": "dict",
        "properties": {
            "n": {"type": "integer", "default": 3},
            "x": {"type": "float", "default": "1.5"},
            "pair": {"type": "tuple", "items": {"type": "float"}},
            "anything": {"type": "any", "description": "whatever"},
            "flag": {"type": "boolean", "optional": True, "default": "false"},
            "opts": {"type": "dict", "properties": {"deep": {"type": "string", "default": None}}},
            "kinds": {
                "type": "array",
                "items": {"type": "string"},
                "enum": ["a", "b"],
                "default": "all",
            },
        },
        "required": ["n"],
        "optional": ["x"],
    }
    schema, dropped = convert_bfcl_schema(bfcl)
    assert schema == {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "default": 3},
            "x": {"type": "number"},
            "pair": {"type": "array", "items": {"type": "number"}},
            "anything": {"description": "whatever"},
            "flag": {"type": "boolean"},
            "opts": {"type": "object", "properties": {"deep": {"type": "string"}}},
            "kinds": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
        },
        "required": ["n"],
    }
    assert dropped == ["x", "flag", "opts.deep", "kinds"]
    assert check_schema(schema) is None


def test_openai_names_are_unique() -> None:
    assert openai_names(["math.factorial", "math_factorial", "a b"]) == {
        "math.factorial": "math_factorial",
        "math_factorial": "math_factorial_2",
        "a b": "a_b",
    }
    assert len(openai_names(["x." * 40])["x." * 40]) == 64


def test_unsupported_category_is_refused() -> None:
    with pytest.raises(ValueError, match="multi_turn_base"):
        load_bfcl("multi_turn_base")


def test_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("OOO_SPEC_HOME", str(tmp_path / "home"))
    assert ooo_spec_home() == tmp_path / "home"
    monkeypatch.delenv("OOO_SPEC_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ooo_spec_home() == tmp_path / "xdg" / "ooo-spec"
