"""Server-registered tools: `ToolSpec`, the `@tool` decorator and `ToolRegistry`.

A tool is server-known when a request names it and it is registered here. Its flags decide
whether it may run before the main model commits to the call (see `app.tools.policy`):
`idempotent` (running it twice with the same arguments is as safe as once) and `speculate`
(`always` lets a validated prediction start it; only idempotent tools may say so). Both default
to the safe side: a decorated function is not idempotent unless its author says so.

`ToolRegistry.execute` never raises and never hangs: unknown names, invalid arguments,
exceptions and timeouts all become a `ToolResult` with `is_error=True` and a message the model
can read.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from app.config import ToolOverride
from app.speculation.validation import (
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LIST_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    check_schema,
    iter_subschemas,
    validate_arguments,
)
from app.tools.call_context import ToolCallContext, context_for

Speculate = Literal["always", "never"]
ToolSource = Literal["python", "mcp"]

DEFAULT_TIMEOUT_S = 10.0
# Threads for synchronous tools. A sync tool past its timeout keeps its thread until it returns
# (Python cannot stop a thread), so tools get their own pool instead of starving the loop's.
DEFAULT_MAX_THREADS = 16
_MAX_ERROR_CHARS = 1000
_MARK = "__ooo_spec_tool__"

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger(__name__)


class ToolDefinitionError(ValueError):
    """A tool cannot be registered as written (bad signature, duplicate name, bad override)."""


class ToolSpec(BaseModel):
    """What the server knows about one tool: the wire description plus the speculation flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] = Field(description="JSON Schema of the arguments object.")
    idempotent: bool
    speculate: Speculate
    timeout_s: float = Field(gt=0)
    source: ToolSource
    egress: bool = Field(False, description="Reaches services outside this deployment.")

    @model_validator(mode="after")
    def _consistent(self) -> ToolSpec:
        if self.speculate == "always" and not self.idempotent:
            raise ValueError(
                f"tool {self.name!r}: speculate='always' needs idempotent=True "
                "(a tool that is not idempotent never runs before the main model commits)"
            )
        problem = check_schema(self.parameters)
        if problem is not None:
            raise ValueError(f"tool {self.name!r}: {problem}")
        return self

    def openai_tool(self) -> dict[str, Any]:
        """The entry of `GET /v1/tools` (docs/wire-contract.md, "GET /v1/tools")."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
            "idempotent": self.idempotent,
            "speculate": self.speculate,
            "source": self.source,
        }


class ToolResult(BaseModel):
    """The outcome of one execution, ready to become a `tool` message."""

    model_config = ConfigDict(extra="forbid")

    name: str
    content: str = Field(
        description="A str result as is, any other result as compact JSON, or the error text."
    )
    is_error: bool = False
    latency_ms: float = Field(ge=0)


@dataclass(frozen=True)
class ToolOutput:
    """What a tool implementation hands back; the registry adds name and latency."""

    content: str
    is_error: bool = False


# An implementation gets arguments already validated against the tool's schema.
ToolRunner = Callable[[dict[str, Any]], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class PythonTool:
    """A decorated function with its spec and the pydantic model that types its arguments."""

    spec: ToolSpec
    function: Callable[..., Any]
    arguments_model: type[BaseModel]
    # model field name -> parameter name; fields are named p0, p1, ... so that parameters
    # called `schema`, `json` or `model_config` cannot clash with BaseModel's attributes.
    parameter_of_field: dict[str, str]
    is_async: bool

    def keyword_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Typed keyword arguments (enums, datetimes, nested models) from JSON arguments."""
        parsed = self.arguments_model.model_validate(arguments)
        return {param: getattr(parsed, f) for f, param in self.parameter_of_field.items()}


@overload
def tool(function: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    speculate: Speculate | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    egress: bool = False,
) -> Callable[[F], F]: ...


def tool(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    speculate: Speculate | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    egress: bool = False,
) -> F | Callable[[F], F]:
    """Mark a typed function (sync or async) as a server tool; usable as `@tool` or `@tool(...)`.

    Name and description default to the function's name and docstring; the JSON Schema comes
    from the signature (defaults become schema defaults, `Annotated[T, Field(description=...)]`
    describes a parameter). `speculate` defaults to 'always' for idempotent tools and 'never'
    otherwise. The function itself is returned unchanged, so it stays directly callable.
    """

    def decorate(fn: F) -> F:
        python_tool = _build_python_tool(
            fn,
            name=name,
            description=description,
            idempotent=idempotent,
            speculate=speculate,
            timeout_s=timeout_s,
            egress=egress,
        )
        setattr(fn, _MARK, python_tool)
        return fn

    return decorate(function) if function is not None else decorate


def python_tool_of(obj: Any) -> PythonTool | None:
    """The `PythonTool` a `@tool` decoration attached to `obj`, if any."""
    found = getattr(obj, _MARK, None) if callable(obj) else None
    return found if isinstance(found, PythonTool) else None


@dataclass(frozen=True)
class _Entry:
    spec: ToolSpec
    run: ToolRunner


class ToolRegistry:
    """Tools by name, from Python modules and MCP servers, and the one way to execute them."""

    def __init__(self, *, max_threads: int = DEFAULT_MAX_THREADS) -> None:
        self._entries: dict[str, _Entry] = {}
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tool")

    # -- registration -------------------------------------------------------------------------

    def register(self, spec: ToolSpec, run: ToolRunner) -> None:
        """Add a tool with any implementation (the MCP source uses this)."""
        if spec.name in self._entries:
            other = self._entries[spec.name].spec.source
            raise ToolDefinitionError(
                f"tool {spec.name!r} from {spec.source} is already registered (from {other})"
            )
        self._entries[spec.name] = _Entry(spec, run)

    def register_function(self, function: Callable[..., Any]) -> ToolSpec:
        """Add a Python function; one without `@tool` gets the decorator's defaults."""
        found = python_tool_of(function)
        python_tool = found if found is not None else _build_python_tool(function)
        self.register(python_tool.spec, self._python_runner(python_tool))
        return python_tool.spec

    def load_modules(self, modules: Iterable[str]) -> list[str]:
        """Import each module and register its `@tool` functions; returns the names added.

        A function reachable from several listed modules (re-exported) is registered once;
        two different functions under one name are an error.
        """
        added: list[str] = []
        seen_functions: set[int] = set()
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ToolDefinitionError(
                    f"cannot import tool module {module_name!r}: {exc}"
                ) from exc
            for value in list(vars(module).values()):
                python_tool = python_tool_of(value)
                if python_tool is None or id(python_tool.function) in seen_functions:
                    continue
                seen_functions.add(id(python_tool.function))
                self.register(python_tool.spec, self._python_runner(python_tool))
                added.append(python_tool.spec.name)
        return added

    def apply_overrides(self, overrides: Mapping[str, ToolOverride]) -> None:
        """Correct registered tools' flags from config; an unknown name is an error (typos)."""
        unknown = sorted(set(overrides) - set(self._entries))
        if unknown:
            known = ", ".join(self.names()) or "none"
            raise ToolDefinitionError(
                f"tool_worker.overrides names unregistered tools {unknown} (registered: {known})"
            )
        for name, override in overrides.items():
            entry = self._entries[name]
            self._entries[name] = _Entry(_overridden(entry.spec, override), entry.run)

    # -- lookup -------------------------------------------------------------------------------

    def get(self, name: str) -> ToolSpec | None:
        entry = self._entries.get(name)
        return entry.spec if entry is not None else None

    def names(self) -> list[str]:
        return list(self._entries)

    def specs(self) -> list[ToolSpec]:
        return [entry.spec for entry in self._entries.values()]

    def schemas(self) -> dict[str, dict[str, Any]]:
        """{name: parameters}: what canonical equality and validation need."""
        return {name: entry.spec.parameters for name, entry in self._entries.items()}

    def openai_tools(self) -> list[dict[str, Any]]:
        """The `data` list of `GET /v1/tools`, in registration order."""
        return [entry.spec.openai_tool() for entry in self._entries.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- execution ----------------------------------------------------------------------------

    async def execute(
        self, name: str, arguments: Any, call: ToolCallContext | None = None
    ) -> ToolResult:
        """Validate and run one call, in `call`'s context (the anonymous tenant's by default);
        every failure is an error result, never an exception."""
        started = time.perf_counter()

        def finish(output: ToolOutput) -> ToolResult:
            latency_ms = (time.perf_counter() - started) * 1000.0
            content = output.content
            if output.is_error and len(content) > _MAX_ERROR_CHARS:
                content = content[: _MAX_ERROR_CHARS - 3] + "..."
            return ToolResult(
                name=name, content=content, is_error=output.is_error, latency_ms=latency_ms
            )

        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self.names()) or "none"
            return finish(ToolOutput(f"unknown tool {name!r} (registered: {known})", True))
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            return finish(ToolOutput(f"arguments of {name!r} must be an object, got {kind}", True))
        # Off the worker's event loop: other calls' results go out while this one validates.
        problems = await asyncio.to_thread(validate_arguments, arguments, entry.spec.parameters)
        if problems:
            return finish(
                ToolOutput(f"invalid arguments for {name!r}: " + "; ".join(problems), True)
            )
        return finish(await _run_bounded(name, entry.run, arguments, entry.spec.timeout_s,
                                         call or ToolCallContext()))

    def close(self) -> None:
        """Release the thread pool (running sync tools finish on their own)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _python_runner(self, python_tool: PythonTool) -> ToolRunner:
        async def run(arguments: dict[str, Any]) -> ToolOutput:
            try:
                kwargs = python_tool.keyword_arguments(arguments)
            except ValidationError as exc:
                return ToolOutput(_pydantic_problems(python_tool.spec.name, exc), True)
            if python_tool.is_async:
                return _encode(await python_tool.function(**kwargs))
            loop = asyncio.get_running_loop()
            call = functools.partial(_call_and_encode, python_tool.function, kwargs)
            # The thread runs in this task's context: the tool sees its `ToolCallContext`.
            in_context = functools.partial(contextvars.copy_context().run, call)
            return await loop.run_in_executor(self._executor, in_context)

        return run


async def _run_bounded(
    name: str, run: ToolRunner, arguments: dict[str, Any], timeout_s: float,
    call: ToolCallContext,
) -> ToolOutput:
    # asyncio.wait rather than wait_for: wait_for waits for the cancelled task to finish, so a
    # tool that swallows CancelledError would hang the caller; here the timeout is a hard bound.
    task = asyncio.get_running_loop().create_task(_guarded(run, arguments),
                                                  context=context_for(call))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_discard_outcome)
        return ToolOutput(f"tool {name!r} timed out after {timeout_s:g} s", True)
    if task.cancelled():
        return ToolOutput(f"tool {name!r} was cancelled", True)
    error = task.exception()
    if error is not None:
        return ToolOutput(f"tool {name!r} failed: {_describe(error)}", True)
    return task.result()


async def _guarded(run: ToolRunner, arguments: dict[str, Any]) -> ToolOutput:
    # Only to give `ensure_future` a coroutine even when `run` returns some other awaitable.
    return await run(arguments)


def _discard_outcome(task: asyncio.Future[Any]) -> None:
    # Retrieve the late outcome so asyncio does not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()


def _call_and_encode(function: Callable[..., Any], kwargs: dict[str, Any]) -> ToolOutput:
    # Runs in the tool thread; encoding here keeps large results off the event loop.
    return _encode(function(**kwargs))


def _encode(value: Any) -> ToolOutput:
    if isinstance(value, str):
        return ToolOutput(value)
    try:
        return ToolOutput(pydantic_core.to_json(value).decode())
    except pydantic_core.PydanticSerializationError as exc:
        return ToolOutput(f"tool returned a value that is not JSON-serialisable: {exc}", True)


def _describe(error: BaseException) -> str:
    """What the model (and the client) see of a tool's exception. A `ValueError`'s message is
    the tool's own answer to bad input (e.g. the calculator's); any other exception's text may
    hold internals (paths, hosts, stack details), so only its type is shown and the rest
    logged."""
    text = str(error)
    if isinstance(error, ValueError) and text:
        return f"{type(error).__name__}: {text}"
    logger.warning("tool failed: %s: %s", type(error).__name__, text)
    return type(error).__name__


def _pydantic_problems(name: str, exc: ValidationError) -> str:
    problems = [
        f"$.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else err["msg"]
        for err in exc.errors()
    ]
    return f"invalid arguments for {name!r}: " + "; ".join(problems)


def _overridden(spec: ToolSpec, override: ToolOverride) -> ToolSpec:
    data = spec.model_dump()
    changes = override.model_dump(exclude_none=True)
    if "idempotent" in changes and changes["idempotent"] != spec.idempotent:
        # A changed idempotency moves speculation to its default unless set explicitly too.
        changes.setdefault("speculate", "always" if changes["idempotent"] else "never")
    data.update(changes)
    try:
        return ToolSpec.model_validate(data)
    except ValidationError as exc:
        raise ToolDefinitionError(f"override of {spec.name!r} is inconsistent: {exc}") from exc


def _build_python_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    speculate: Speculate | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    egress: bool = False,
) -> PythonTool:
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise ToolDefinitionError(f"tool {fn.__qualname__}: generators cannot be tools")
    tool_name = name or fn.__name__
    model, parameter_of_field = _arguments_model(fn, tool_name)
    try:
        spec = ToolSpec(
            name=tool_name,
            description=description if description is not None else _doc_description(fn),
            parameters=_tool_schema(model),
            idempotent=idempotent,
            speculate=speculate or ("always" if idempotent else "never"),
            timeout_s=timeout_s,
            source="python",
            egress=egress,
        )
    except ValidationError as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: {exc}") from exc
    return PythonTool(
        spec=spec,
        function=fn,
        arguments_model=model,
        parameter_of_field=parameter_of_field,
        is_async=inspect.iscoroutinefunction(fn),
    )


def _doc_description(fn: Callable[..., Any]) -> str:
    # Docstring lines are wrapped for the source file, not for the model: rejoin paragraphs.
    paragraphs = (inspect.getdoc(fn) or "").split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _arguments_model(
    fn: Callable[..., Any], tool_name: str
) -> tuple[type[BaseModel], dict[str, str]]:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError) as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve annotations: {exc}") from exc
    fields: dict[str, Any] = {}
    parameter_of_field: dict[str, str] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} must be passable by keyword "
                "(no *args, **kwargs or positional-only parameters)"
            )
        if param.name not in hints:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation "
                "(the JSON Schema is derived from it)"
            )
        default = ... if param.default is param.empty else param.default
        field_name = f"p{index}"
        fields[field_name] = (hints[param.name], Field(default, alias=param.name))
        parameter_of_field[field_name] = param.name
    try:
        model = create_model(  # type: ignore[call-overload]
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **fields,
        )
    except (TypeError, ValueError, pydantic_core.SchemaError) as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: unsupported signature: {exc}") from exc
    return model, parameter_of_field


def _tool_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema, as small models read best: `$ref`s inlined, no titles."""
    schema = _inline_refs(model.model_json_schema())
    for sub in iter_subschemas(schema):
        sub.pop("title", None)  # pydantic's titles repeat the property names
    return schema


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace `#/$defs/...` references by their targets; recursive schemas stay as they are."""
    defs = schema.get("$defs")
    if not isinstance(defs, dict):
        return schema

    class _Recursive(Exception):
        pass

    def inline(node: Any, stack: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node  # boolean schemas
        out: dict[str, Any] = {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = ref.removeprefix("#/$defs/")
            if target == ref or target in stack or target not in defs:
                raise _Recursive
            out.update(inline(defs[target], (*stack, target)))
        # Only subschema keywords are walked: `default`, `enum`, `const` and property names
        # are data and stay exactly as they are (see app.speculation.validation.SUBSCHEMA_KEYWORDS).
        for keyword, value in node.items():
            if keyword in ("$ref", "$defs"):
                continue
            if keyword in SUBSCHEMA_KEYWORDS or (keyword == "items" and isinstance(value, list)):
                walked = (
                    [inline(v, stack) for v in value]
                    if isinstance(value, list)
                    else inline(value, stack)
                )
            elif keyword in SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
                walked = [inline(v, stack) for v in value]
            elif keyword in SUBSCHEMA_MAP_KEYWORDS and isinstance(value, dict):
                walked = {k: inline(v, stack) for k, v in value.items()}
            else:
                walked = value
            out[keyword] = walked
        return out

    try:
        result = inline(schema, ())
    except _Recursive:
        return schema
    assert isinstance(result, dict)
    return result
