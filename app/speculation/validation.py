"""JSON Schema validation of tool schemas and of tool arguments.

Tool schemas come from clients (`tools` in a request) and from the server's registry; arguments
come from the sidecar's prediction or the main model's output. Both are checked here with
Draft 2020-12 semantics (a schema's own `$schema` wins when it names another draft). Validators
are compiled once per distinct schema and cached, because the same few tool schemas are seen on
every request.

Schemas never reach the network. A client's schema is attacker-chosen: a reference to
`http://169.254.169.254/...` or an internal service would make the server fetch it (SSRF; with no
timeout, a URL that never answers froze the caller), and whether validation then passed would
tell the client what the URL returned. Two guards, each enough on its own:

- every validator is built here (`build_validator`) with `LOCAL_ONLY_REGISTRY`, whose retrieve
  refuses every URI: a reference resolves inside the schema itself or not at all;
- `check_schema` refuses, with the keyword named, every reference (`$ref`, `$dynamicRef`,
  `$recursiveRef`, at any depth, in any keyword that holds a subschema, draft-07 `dependencies`
  included) that is not a JSON pointer into the same document (`#`, `#/$defs/...`), and every
  `$id` below the top level (it would change what the references under it resolve against).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import unquote

import jsonschema
import re2
import referencing
import referencing.exceptions
from jsonschema import _utils as jsonschema_utils
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

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
        "contentSchema",
    }
)
SUBSCHEMA_LIST_KEYWORDS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
# Draft-07 `dependencies` maps a name to a subschema or to a list of names (data, skipped).
SUBSCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
     "dependencies"}
)
# Keywords whose value is a URI reference that validation resolves. `$recursiveRef` (2019-09)
# may only be "#"; the other two may be any JSON pointer into the same document.
REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Draft 3 also puts subschemas in `type`, `disallow` and `extends`; nobody writes it any more,
# and refusing it keeps one walk for every dialect.
_REFUSED_DIALECTS = frozenset({"http://json-schema.org/draft-03/schema"})
# Dialects whose identifier keyword is `id`, not `$id`.
_LEGACY_ID_DIALECTS = frozenset({"http://json-schema.org/draft-04/schema"})

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


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    """Every reference that does not resolve inside the schema itself lands here: refused,
    never fetched (jsonschema's default would `urlopen` it)."""
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


# The metaschemas (jsonschema_specifications, in memory) are added by jsonschema itself.
LOCAL_ONLY_REGISTRY: referencing.Registry[Any] = referencing.Registry(
    retrieve=_refuse_retrieval  # type: ignore[call-arg]
)


def build_validator(schema: Any) -> Validator:
    """A validator for `schema` under its own `$schema` (Draft 2020-12 when none), RE2 regexes,
    the format checks above and `LOCAL_ONLY_REGISTRY`: the one place validators are made."""
    cls = _re2_validator_class(validator_for(schema, default=jsonschema.Draft202012Validator))
    validator: Validator = cls(schema, format_checker=FORMAT_CHECKER,
                               registry=LOCAL_ONLY_REGISTRY)
    return validator


@functools.lru_cache(maxsize=16)
def _meta_format_checker(meta_cls: Any) -> jsonschema.FormatChecker:
    """The metaschema's own format checks, but `format: regex` (every `pattern` and
    `patternProperties` key) compiled by RE2: jsonschema's default compiles it with Python's
    `re`, whose compile time a client's pattern chooses (hundreds of long case-insensitive
    patterns: minutes of CPU), with no way to stop it."""
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers.update(meta_cls.FORMAT_CHECKER.checkers)
    checker.checkers.pop("regex", None)
    checker.checks("regex")(_is_regex)
    return checker


def _metaschema_error(schema: Any) -> jsonschema.exceptions.ValidationError | None:
    """The first way `schema` breaks its dialect's metaschema (what `cls.check_schema` raises),
    checked by a validator built with `LOCAL_ONLY_REGISTRY` like every other."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    meta_cls = validator_for(cls.META_SCHEMA, default=cls)
    validator = meta_cls(cls.META_SCHEMA, format_checker=_meta_format_checker(meta_cls),
                         registry=LOCAL_ONLY_REGISTRY)
    return next(iter(validator.iter_errors(schema)), None)


def schema_key(schema: Any) -> str:
    """Stable JSON text of a schema: the cache key for its compiled validator."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=1024)
def _compiled(key: str) -> Validator:
    # Compiled from the key's own parse, so a caller mutating its dict later cannot change a
    # validator that is already cached.
    return build_validator(json.loads(key))


def compiled_validator(schema: Mapping[str, Any]) -> Validator:
    """The cached validator for `schema` (compiled on first use)."""
    return _compiled(schema_key(schema))


def subschema_children(node: dict[str, Any]) -> Iterator[Any]:
    """The values directly below `node` that are subschemas (or lists/maps' entries that may
    be: callers skip what is not a dict)."""
    for keyword, value in node.items():
        if keyword in SUBSCHEMA_KEYWORDS:
            yield from (value if isinstance(value, list) else [value])
        elif keyword in SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
            yield from value
        elif keyword in SUBSCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            yield from value.values()


def iter_subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """`schema` and every subschema below it, depth first (boolean schemas are skipped)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for child in subschema_children(schema):
        yield from iter_subschemas(child)


def resolve_local_ref(root: Any, ref: str, keyword: str = "$ref") -> Any:
    """The part of `root` a local reference (`#` or `#/json/pointer`) points to.

    Raises LookupError, naming `keyword`, when the reference is not local or points nowhere.
    """
    if not ref.startswith("#"):
        raise LookupError(f"{keyword} {ref!r} is not a local reference: the server never "
                          "fetches schemas, only '#' and '#/json/pointer' into the same "
                          "schema are supported")
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        raise LookupError(f"{keyword} {ref!r}: anchors are not supported, use a JSON pointer")
    node = root
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(f"{keyword} {ref!r} points nowhere")
    return node


def local_references(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(keyword, value) of each reference keyword in `node` itself."""
    for keyword in REFERENCE_KEYWORDS:
        if keyword in node:
            yield keyword, node[keyword]


def reference_problem(schema: dict[str, Any]) -> str | None:
    """Why a reference or an identifier in `schema` could send validation outside it, or None.

    Walks every subschema and every part of the schema a local reference points to (a
    reference into an unknown keyword makes that part a subschema too), so no reference is
    left unchecked at any depth."""
    dialect = str(schema.get("$schema", "")).rstrip("#")
    if dialect in _REFUSED_DIALECTS:
        return f"$schema {schema['$schema']!r}: draft-03 schemas are not supported"
    legacy_id = dialect in _LEGACY_ID_DIALECTS
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(schema, True)]
    while stack:
        node, top = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if not top:
            for ident in ("$id", "id") if legacy_id else ("$id",):
                if isinstance(node.get(ident), str):
                    return (f"{ident} {node[ident]!r} below the top level is not supported: it "
                            "would change what the references under it resolve against")
        for keyword, ref in local_references(node):
            if not isinstance(ref, str):
                return f"{keyword} must be a string, got {type(ref).__name__}"
            if keyword == "$recursiveRef" and ref != "#":
                return (f"$recursiveRef {ref!r} is not supported: the server never fetches "
                        "schemas, only '#' is allowed")
            try:
                target = resolve_local_ref(schema, ref, keyword)
            except LookupError as exc:
                return str(exc)
            stack.append((target, target is schema))
        stack.extend((child, False) for child in subschema_children(node))
    return None


def check_schema(schema: Any, *, tool_parameters: bool = True) -> str | None:
    """Why `schema` cannot serve as a tool's `parameters`, or None when it can.

    Checks, in order: it is a JSON object; it is valid under its metaschema; every reference is
    local and resolves and no `$id` below the top level moves their base (`reference_problem`);
    and, unless `tool_parameters=False` (any other schema, e.g. the
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
    error = _metaschema_error(schema)
    if error is not None:
        where = _json_path(error.absolute_path)
        return f"not a valid JSON Schema at {where}: {_short(error.message)}"
    problem = reference_problem(schema)
    if problem is not None:
        return problem
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
