"""Tool registry and decorator (app.tools.registry): schemas from signatures, execution."""

from __future__ import annotations

import asyncio
import threading
from enum import StrEnum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from app.config import ToolOverride
from app.speculation.validation import check_schema
from app.tools.registry import (
    ToolDefinitionError,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    python_tool_of,
    tool,
)


class Unit(StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Location(BaseModel):
    city: str
    country: str = "FR"


class Tree(BaseModel):
    label: str
    children: list[Tree] = []


@tool(idempotent=True)
def weather(
    location: Location,
    unit: Unit = Unit.CELSIUS,
    days: Annotated[int, Field(ge=1, le=14, description="Days ahead.")] = 3,
    mode: Literal["brief", "full"] = "brief",
) -> dict[str, Any]:
    """Weather forecast for a place.

    Wrapped docstring lines
    are joined.
    """
    return {"city": location.city, "unit": unit, "unit_type": type(unit).__name__, "days": days}


@tool
async def shout(text: str) -> str:
    return text.upper()


@tool(name="sum_numbers", description="Add numbers.", timeout_s=1.5, egress=True)
def add(numbers: list[float], schema: str = "x", model_config: int = 0) -> float:
    # `schema` and `model_config` would clash with BaseModel attributes as field names.
    return sum(numbers)


def registry_with(*functions: Any) -> ToolRegistry:
    registry = ToolRegistry()
    for function in functions:
        registry.register_function(function)
    return registry


# -- schema from the signature ---------------------------------------------------------------


def test_schema_from_signature_has_types_defaults_enums_and_descriptions() -> None:
    spec = registry_with(weather).get("weather")
    assert spec is not None
    assert (
        spec.description == "Weather forecast for a place.\n\nWrapped docstring lines are joined."
    )
    params = spec.parameters
    assert params["type"] == "object"
    assert params["additionalProperties"] is False
    assert params["required"] == ["location"]
    props = params["properties"]
    assert props["unit"] == {
        "type": "string",
        "enum": ["celsius", "fahrenheit"],
        "default": "celsius",
    }
    assert props["days"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 14,
        "default": 3,
        "description": "Days ahead.",
    }
    assert props["mode"] == {"type": "string", "enum": ["brief", "full"], "default": "brief"}
    # Nested models are inlined (no $ref for a small model to follow) and titles are dropped.
    assert props["location"]["properties"]["country"] == {"type": "string", "default": "FR"}
    assert "$defs" not in params and "title" not in params and "title" not in props["location"]
    assert check_schema(params) is None


def test_recursive_models_keep_their_refs_and_stay_valid() -> None:
    @tool
    def draw(tree: Tree) -> str:
        return tree.label

    params = registry_with(draw).schemas()["draw"]
    assert "$defs" in params
    assert check_schema(params) is None


def test_decorator_options_and_defaults() -> None:
    spec = registry_with(add).get("sum_numbers")
    assert spec is not None
    assert (spec.description, spec.timeout_s, spec.egress, spec.source) == (
        "Add numbers.",
        1.5,
        True,
        "python",
    )
    assert (spec.idempotent, spec.speculate) == (False, "never")  # safe by default
    assert set(spec.parameters["properties"]) == {"numbers", "schema", "model_config"}
    weather_spec = python_tool_of(weather)
    assert weather_spec is not None and weather_spec.spec.speculate == "always"
    assert weather(Location(city="Oslo"))["city"] == "Oslo"  # still a plain function


def test_speculate_always_needs_idempotent() -> None:
    with pytest.raises(ToolDefinitionError, match="idempotent"):

        @tool(speculate="always")
        def risky(x: int) -> int:
            return x


def test_unannotated_and_variadic_parameters_are_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="type annotation"):

        @tool
        def untyped(x) -> None:  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(ToolDefinitionError, match="keyword"):

        @tool
        def variadic(*values: int) -> None:
            pass


def test_openai_tools_shape() -> None:
    registry = registry_with(weather, shout)
    entries = registry.openai_tools()
    assert [e["function"]["name"] for e in entries] == ["weather", "shout"]
    assert entries[1] == {
        "type": "function",
        "function": {
            "name": "shout",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
        "idempotent": False,
        "speculate": "never",
        "source": "python",
    }


def test_duplicate_names_are_rejected() -> None:
    registry = registry_with(shout)

    @tool(name="shout")
    def other(text: str) -> str:
        return text

    with pytest.raises(ToolDefinitionError, match="already registered"):
        registry.register_function(other)


def test_load_modules_collects_decorated_functions_once() -> None:
    registry = ToolRegistry()
    added = registry.load_modules(["app.tools.builtin", "app.tools.builtin"])
    assert added == registry.names()
    assert {"calculator", "convert_units", "current_time", "search_docs", "append_note"} <= set(
        added
    )
    with pytest.raises(ToolDefinitionError, match="cannot import"):
        ToolRegistry().load_modules(["app.tools.no_such_module"])


# -- overrides -------------------------------------------------------------------------------


def test_overrides_change_flags_and_keep_consistency() -> None:
    registry = registry_with(weather, shout)
    registry.apply_overrides(
        {
            "weather": ToolOverride(timeout_s=0.5, egress=True),
            "shout": ToolOverride(idempotent=True),
        }
    )
    weather_spec, shout_spec = registry.get("weather"), registry.get("shout")
    assert weather_spec is not None and shout_spec is not None
    assert (weather_spec.timeout_s, weather_spec.egress, weather_spec.speculate) == (
        0.5,
        True,
        "always",
    )
    assert (shout_spec.idempotent, shout_spec.speculate) == (True, "always")
    registry.apply_overrides({"weather": ToolOverride(idempotent=False)})
    weather_spec = registry.get("weather")
    assert weather_spec is not None and weather_spec.speculate == "never"


def test_bad_overrides_are_errors() -> None:
    registry = registry_with(shout)
    with pytest.raises(ToolDefinitionError, match="unregistered"):
        registry.apply_overrides({"shuot": ToolOverride(timeout_s=1)})
    with pytest.raises(ToolDefinitionError, match="inconsistent"):
        registry.apply_overrides({"shout": ToolOverride(speculate="always")})


# -- execution -------------------------------------------------------------------------------


async def test_sync_tool_runs_in_a_thread_with_typed_arguments() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    @tool
    def where(value: int) -> int:
        seen.append(threading.get_ident())
        return value * 2

    registry = registry_with(weather, where)
    result = await registry.execute(
        "weather", {"location": {"city": "Paris"}, "unit": "fahrenheit"}
    )
    assert not result.is_error
    assert result.content == '{"city":"Paris","unit":"fahrenheit","unit_type":"Unit","days":3}'
    assert (await registry.execute("where", {"value": 21})).content == "42"
    assert seen and seen[0] != loop_thread


async def test_async_tool_and_str_results_pass_through() -> None:
    result = await registry_with(shout).execute("shout", {"text": "hi"})
    assert isinstance(result, ToolResult)
    assert (result.name, result.content, result.is_error) == ("shout", "HI", False)
    assert result.latency_ms >= 0


@pytest.mark.timeout(60)
async def test_sync_timeout_becomes_an_error_result() -> None:
    started, release = threading.Event(), threading.Event()

    @tool(timeout_s=0.2)
    def stuck() -> str:
        started.set()
        release.wait(timeout=60)  # never set before the verdict: only the timeout can answer
        return "late"

    registry = registry_with(stuck)
    try:
        # The bound only keeps a broken timeout from hanging the run; it is not a speed limit.
        result = await asyncio.wait_for(registry.execute("stuck", {}), timeout=30)
        assert started.is_set()
        assert result.is_error and "timed out after 0.2 s" in result.content
    finally:
        release.set()
        registry.close()


@pytest.mark.timeout(60)
async def test_async_timeout_is_a_hard_bound_even_if_the_tool_ignores_cancellation() -> None:
    never, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool(timeout_s=0.2)
    async def stubborn() -> str:
        try:
            await never.wait()  # nothing sets it: only the timeout can end the call
        except asyncio.CancelledError:
            await release.wait()  # refuses to stop until the test is done
        finished.set()
        return "late"

    # The verdict comes while the cancelled tool still runs: were execute waiting for it, this
    # would hang until the bound (a bound on waiting, not a speed limit).
    result = await asyncio.wait_for(registry_with(stubborn).execute("stubborn", {}), timeout=30)
    assert result.is_error and "timed out" in result.content
    assert not finished.is_set()
    release.set()
    await asyncio.wait_for(finished.wait(), timeout=30)  # the tool ends once let go


async def test_exceptions_become_error_results() -> None:
    @tool
    def broken(x: int) -> int:
        raise RuntimeError(f"bad {x}")

    @tool
    async def broken_async() -> None:
        raise KeyError("missing")

    @tool
    def unserialisable() -> object:
        return object()

    registry = registry_with(broken, broken_async, unserialisable)
    result = await registry.execute("broken", {"x": 1})
    assert result.is_error and result.content == "tool 'broken' failed: RuntimeError"
    result = await registry.execute("broken_async", {})
    assert result.is_error and "KeyError" in result.content
    result = await registry.execute("unserialisable", {})
    assert result.is_error and "not JSON-serialisable" in result.content


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "'location' is a required property"),
        ({"location": {"city": "Paris"}, "days": 0}, "$.days: 0 is less than the minimum of 1"),
        ({"location": {"city": "Paris"}, "unit": "kelvin"}, "$.unit: 'kelvin' is not one of"),
        ({"location": {"city": "Paris"}, "extra": 1}, "Additional properties are not allowed"),
        ({"location": {"city": "Paris"}, "days": "3"}, "$.days: '3' is not of type 'integer'"),
        ({"location": {"city": "Paris"}, "days": True}, "is not of type 'integer'"),
    ],
)
async def test_invalid_arguments_are_reported_not_run(
    arguments: dict[str, Any], fragment: str
) -> None:
    result = await registry_with(weather).execute("weather", arguments)
    assert result.is_error
    assert result.content.startswith("invalid arguments for 'weather': ")
    assert fragment in result.content


async def test_unknown_tool_and_non_object_arguments() -> None:
    registry = registry_with(shout)
    result = await registry.execute("nope", {})
    assert result.is_error and "unknown tool 'nope'" in result.content and "shout" in result.content
    result = await registry.execute("shout", ["hi"])
    assert result.is_error and "must be an object" in result.content


async def test_long_error_messages_are_truncated() -> None:
    @tool
    def verbose() -> None:
        raise ValueError("x" * 10_000)

    result = await registry_with(verbose).execute("verbose", {})
    assert result.is_error and len(result.content) <= 1000


def test_tool_spec_rejects_bad_parameter_schemas() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        ToolSpec(
            name="t",
            parameters={"type": "string"},
            idempotent=False,
            speculate="never",
            timeout_s=1,
            source="mcp",
        )
