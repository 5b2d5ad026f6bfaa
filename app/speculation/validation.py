"""JSON Schema validation of tool schemas and of tool arguments.

Tool schemas come from clients (`tools` in a request) and from the server's registry; arguments
come from the sidecar's prediction or the main model's output. Both are checked here with
Draft 2020-12 semantics (a schema's own `$schema` wins when it names another draft). Validators
are compiled once per distinct schema and cached, because the same few tool schemas are seen on
every request.

Only local references (`#`, `#/$defs/...`, any JSON pointer into the same document) are
supported: the server never fetches remote schemas, so `check_schema` rejects anything else
instead of letting validation fail later.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import jsonschema
import re2
import referencing.exceptions
from jsonschema import _utils as jsonschema_utils
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

if TYPE_CHECKING:
    pass

# Keywords whose value is one subschema, a list of subschemas, or a map of name -> subschema.
# Walking only these keeps data (`enum`, `const`, `default`, `examples`) out of schema walks, so
# a property that happens to be called "$ref" or a default shaped like a schema is never touched.
SUBSCHEMA_KEYWORDS = frozenset(
    {
        "items",
        "additionalItems",
        "additionalProperties",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
SUBSCHEMA_LIST_KEYWORDS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
SUBSCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)

_MAX_MESSAGE_CHARS = 300

_RFC3339_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_RFC3339_TIME = re.compile(r"^\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\s]*$")


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339_DATE_TIME.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339_TIME.match(value):
        return False
    hour, minute, second = (int(part) for part in value[:8].split(":"))
    return hour < 24 and minute < 60 and second < 61  # 60: leap second


def _is_uri(value: object) -> bool:
    return not isinstance(value, str) or bool(_URI.match(value))


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a client's bad pattern is a 400, not a line on stderr


@functools.lru_cache(maxsize=1024)
def compile_re2(pattern: str) -> Any:
    """`pattern` compiled by RE2 (linear-time matching); raises `re2.error`."""
    return re2.compile(pattern, _RE2_OPTIONS)


def _re2_search(pattern: str, text: str) -> bool:
    return compile_re2(pattern).search(text) is not None


def _is_regex(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        compile_re2(value)
    except re2.error:
        return False
    return True


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    try:
        found = _re2_search(pattern, instance)
    except re2.error:
        yield jsonschema.ValidationError(f"pattern {pattern!r} is not supported (RE2 syntax)")
        return
    if not found:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _matches_any(patterns: Any, name: str) -> bool:
    try:
        return any(_re2_search(p, name) for p in patterns)
    except re2.error:
        return False


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any
                        ) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _matches_any([pattern], key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any
                           ) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [k for k in instance if k not in properties and not _matches_any(patterns, k)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names, verb = jsonschema_utils.extras_msg(sorted(extras, key=str))
        if patterns:
            yield jsonschema.ValidationError(
                f"{names} do not match any of the regexes: "
                f"{', '.join(repr(p) for p in sorted(patterns))}")
        else:
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)")


# Every regex a client's schema brings is matched by RE2, not by Python's backtracking `re`
# (jsonschema's default): matching time is linear in the text whatever the pattern.
_RE2_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


@functools.lru_cache(maxsize=16)
def _re2_validator_class(cls: Any) -> Any:
    return jsonschema.validators.extend(cls, _RE2_KEYWORDS)


def _build_format_checker() -> jsonschema.FormatChecker:
    """jsonschema's checker plus `date-time`, `time` and `uri`.

    jsonschema checks those three only when optional packages (rfc3339-validator, rfc3987) are
    installed; without them a wrong value would pass silently. They are the formats typed Python
    tools produce (`datetime`, `time`, URLs), so they get small stand-ins here.
    """
    # Start from the 2020-12 checkers: a bare FormatChecker() mixes in every draft, e.g.
    # draft 3's "time" (no offset allowed) under the same name.
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers.update(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    extras: dict[str, Callable[[object], bool]] = {
        "date-time": _is_date_time,
        "time": _is_time,
        "uri": _is_uri,
    }
    checker.checkers.pop("regex", None)
    checker.checks("regex")(_is_regex)
    for name, check in extras.items():
        if name not in checker.checkers:
            checker.checks(name)(check)
    return checker


FORMAT_CHECKER = _build_format_checker()


def schema_key(schema: Any) -> str:
    """Stable JSON text of a schema: the cache key for its compiled validator."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=1024)
def _compiled(key: str) -> Validator:
    # Compiled from the key's own parse, so a caller mutating its dict later cannot change a
    # validator that is already cached.
    schema = json.loads(key)
    cls = _re2_validator_class(validator_for(schema, default=jsonschema.Draft202012Validator))
    validator: Validator = cls(schema, format_checker=FORMAT_CHECKER)
    return validator


def compiled_validator(schema: Mapping[str, Any]) -> Validator:
    """The cached validator for `schema` (compiled on first use)."""
    return _compiled(schema_key(schema))


def iter_subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """`schema` and every subschema below it, depth first (boolean schemas are skipped)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for keyword, value in schema.items():
        if keyword in SUBSCHEMA_KEYWORDS or (keyword == "items" and isinstance(value, list)):
            children = value if isinstance(value, list) else [value]
        elif keyword in SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
            children = value
        elif keyword in SUBSCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            children = list(value.values())
        else:
            continue
        for child in children:
            yield from iter_subschemas(child)


def resolve_local_ref(root: Any, ref: str) -> Any:
    """The part of `root` a local `$ref` (`#` or `#/json/pointer`) points to.

    Raises LookupError when the reference is not local or points nowhere.
    """
    if not ref.startswith("#"):
        raise LookupError(f"$ref {ref!r} is not a local reference (only '#...' is supported)")
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        raise LookupError(f"$ref {ref!r}: anchors are not supported, use a JSON pointer")
    node = root
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(f"$ref {ref!r} points nowhere")
    return node


def check_schema(schema: Any, *, tool_parameters: bool = True) -> str | None:
    """Why `schema` cannot serve as a tool's `parameters`, or None when it can.

    Checks, in order: it is a JSON object; it is valid under its metaschema; every `$ref` is
    local and resolves; and, unless `tool_parameters=False` (any other schema, e.g. the
    sidecar's union), the top level accepts JSON objects, since tool arguments always are one.
    """
    if not isinstance(schema, dict):
        return f"parameters must be a JSON Schema object, got {type(schema).__name__}"
    try:
        key = schema_key(schema)
    except (TypeError, ValueError) as exc:
        return f"parameters are not JSON-serialisable: {exc}"
    return _check_schema_key(key, tool_parameters)


@functools.lru_cache(maxsize=1024)
def _check_schema_key(key: str, tool_parameters: bool) -> str | None:
    # Cached: the metaschema check costs 1-10 ms and the same tools arrive on every request.
    schema = json.loads(key)
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = _json_path(exc.absolute_path)
        return f"not a valid JSON Schema at {where}: {_short(exc.message)}"
    for sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str):
            try:
                resolve_local_ref(schema, ref)
            except LookupError as exc:
                return str(exc)
    if not tool_parameters:
        return None
    declared = schema.get("type", "object")
    declared_types = declared if isinstance(declared, list) else [declared]
    if "object" not in declared_types:
        return f"parameters must describe a JSON object, got type {declared!r}"
    return None


def validate_arguments(arguments: Any, schema: Mapping[str, Any]) -> list[str]:
    """Human-readable reasons `arguments` break `schema`; an empty list means valid.

    Each reason starts with a JSON path (`$.location.city`, `$.items[2]`), sorted by path so
    the same input always gives the same list.
    """
    validator = compiled_validator(schema)
    try:
        errors = sorted(
            validator.iter_errors(arguments),
            key=lambda e: ([str(p) for p in e.absolute_path], e.message),
        )
    except (referencing.exceptions.Unresolvable, jsonschema.exceptions.SchemaError) as exc:
        return [f"$: schema cannot be applied: {_short(str(exc))}"]
    except re.error as exc:
        return [f"$: schema has an invalid pattern: {exc}"]
    return [f"{_json_path(e.absolute_path)}: {_short(e.message)}" for e in errors]


def is_valid_against(value: Any, subschema: Any, root: Mapping[str, Any]) -> bool:
    """Whether `value` satisfies `subschema`, a part of `root` (its `$ref`s resolve in root)."""
    try:
        return bool(compiled_validator(root).evolve(schema=subschema).is_valid(value))
    except (referencing.exceptions.Unresolvable, jsonschema.exceptions.SchemaError, re.error):
        return False


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The `parameters` schema of an OpenAI tool; a function without one takes no arguments."""
    function = tool.get("function", tool)
    parameters = function.get("parameters")
    if parameters is None:
        return {"type": "object", "properties": {}}
    return dict(parameters)


def _json_path(path: Any) -> str:
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _short(message: str) -> str:
    # jsonschema repeats the whole offending instance in its message; a 10 kB argument must not
    # become a 10 kB error string in a response or a span.
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    return message[: _MAX_MESSAGE_CHARS - 3] + "..."
