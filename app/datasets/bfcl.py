"""BFCL v4 cases as OpenAI chat requests: the dataset the benchmark measures on
(`load_tests/bench/`, which scores calls with `load_tests/bfcl.py`) and the sidecar's
distillation collects from (`app/distill/collect.py`, on categories the benchmark does not
measure). Here, in the product, so the distillation never imports its benchmark.

The data ships in the `bfcl-eval` wheel (Apache-2.0) under `bfcl_eval/data/`. That package pins
old libraries that break this environment, so it is never installed: the wheel is fetched with
`pip download --no-deps` into the dataset cache and the JSON Lines files are read straight from
the zip.

Conversion to OpenAI tools:
- BFCL types become JSON Schema types: `dict` -> object, `float` -> number, `tuple` -> array,
  `any` -> no type constraint (BFCL's own OpenAI converter says "string"; its checker accepts
  anything there), plus the Java/JS spellings BFCL maps (`long`, `HashMap`, ...).
- BFCL-only keywords (`optional` on parameters, an `optional` list on the object) are dropped;
  whether a parameter may be left out is said by `required` (schema) and by "" among the
  acceptable values (ground truth).
- An `enum` of scalars written on an array (no array can equal a string) moves to `items`.
- A `default` that its own converted schema rejects (`"false"` for a boolean, `"all"` for an
  array of enum strings, ...) is dropped and listed in `BfclCase.dropped_defaults`: filled into
  a candidate by canonicalisation it would make a valid call invalid.
- Names become OpenAI-valid (`^[a-zA-Z0-9_-]{1,64}$`: dots and other characters -> `_`, as
  BFCL's OpenAI handler does); `BfclCase.bfcl_names` maps them back.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.home import model_home
from app.speculation.validation import validate_arguments

BFCL_PACKAGE = "bfcl-eval"
BFCL_VERSION = "2026.3.23"
# The four single-turn AST categories the benchmarks use.
CORE_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
# Categories whose questions carry function docs and whose answers are call ASTs. The others
# (multi_turn_*, memory, web_search, format_sensitivity) need BFCL's executable back ends.
SUPPORTED_CATEGORIES = (
    *CORE_CATEGORIES,
    "simple_java",
    "simple_javascript",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
    "exec_simple",
    "exec_multiple",
    "exec_parallel",
    "exec_parallel_multiple",
)
# BFCL keeps the questions of its retired executable categories (Python functions, like
# `simple_python`'s) among its unused datasets, without AST answers.
_UNUSED_DIR = "unused_datasets/question"

_DATA_DIR = "bfcl_eval/data"
_OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

# BFCL type name -> JSON Schema type; None means "no type constraint".
BFCL_TYPES: dict[str, str | None] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "double": "number",
    "string": "string",
    "char": "string",
    "String": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "Boolean": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "ArrayList": "array",
    "Array": "array",
    "Queue": "array",
    "Stack": "array",
    "dict": "object",
    "object": "object",
    "HashMap": "object",
    "Hashtable": "object",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "Bigint": "integer",
    "any": None,
    "Any": None,
}


class BfclCase(BaseModel):
    """One BFCL question as an OpenAI request, with its ground truth under OpenAI names."""

    model_config = ConfigDict(frozen=True)

    id: str
    category: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    # One entry per expected call: {openai_name: {param: [acceptable values]}}.
    ground_truth: list[dict[str, dict[str, list[Any]]]]
    bfcl_names: dict[str, str]  # OpenAI name -> BFCL name
    dropped_defaults: list[str] = []  # "tool.param.path" of defaults removed (see module doc)


# ---------------------------------------------------------------- locating the data


# One cache root for the whole project (models, wheels, datasets).
ooo_spec_home = model_home


def bfcl_wheel(cache_dir: Path | None = None) -> Path:
    """Path of the bfcl-eval wheel, downloaded (without dependencies) on first use."""
    folder = cache_dir or ooo_spec_home() / "datasets"
    pattern = f"{BFCL_PACKAGE.replace('-', '_')}-{BFCL_VERSION}-*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    # Download into a private folder and move the finished file in, so a concurrent reader
    # never sees half a wheel.
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"{BFCL_PACKAGE}=={BFCL_VERSION}",
            "-d",
            scratch,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(scratch).glob(pattern))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {BFCL_PACKAGE}=={BFCL_VERSION}: {done.stderr.strip()[-800:]}"
            )
        target = folder / wheels[0].name
        shutil.move(str(wheels[0]), target)
    return target


def _read_jsonl(archive: zipfile.ZipFile, member: str) -> list[dict[str, Any]]:
    text = archive.read(member).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- loading


def load_bfcl(category: str, limit: int | None = None, wheel: Path | None = None) -> list[BfclCase]:
    """The cases of one BFCL v4 category (e.g. `simple_python`), in file order.

    Questions are cut to their first turn. A category without a ground-truth file (e.g.
    `irrelevance`) yields cases with an empty `ground_truth`.
    """
    if category not in SUPPORTED_CATEGORIES:
        raise ValueError(
            f"BFCL category {category!r} is not supported; use one of "
            + ", ".join(SUPPORTED_CATEGORIES)
        )
    with zipfile.ZipFile(wheel or bfcl_wheel()) as archive:
        names = set(archive.namelist())
        question_file = f"{_DATA_DIR}/BFCL_v4_{category}.json"
        if question_file not in names:
            question_file = f"{_DATA_DIR}/{_UNUSED_DIR}/BFCL_v4_{category}.json"
        questions = _read_jsonl(archive, question_file)
        answer_file = f"{_DATA_DIR}/possible_answer/BFCL_v4_{category}.json"
        answers = (
            {row["id"]: row["ground_truth"] for row in _read_jsonl(archive, answer_file)}
            if answer_file in names
            else {}
        )
    if limit is not None:
        questions = questions[:limit]
    return [_to_case(row, answers.get(row["id"], []), category) for row in questions]


def _to_case(row: dict[str, Any], ground_truth: list[Any], category: str) -> BfclCase:
    tools, to_openai, dropped = to_openai_tools(row.get("function") or [])
    turns = row.get("question") or [[]]
    return BfclCase(
        id=row["id"],
        category=category,
        messages=[dict(message) for message in turns[0]],
        tools=tools,
        ground_truth=[
            {to_openai.get(name, name): params for name, params in entry.items()}
            for entry in ground_truth
        ],
        bfcl_names={openai: bfcl for bfcl, openai in to_openai.items()},
        dropped_defaults=dropped,
    )


def to_openai_tools(
    functions: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, str], list[str]]:
    """BFCL function docs -> (OpenAI tools, BFCL name -> OpenAI name, paths of the defaults
    dropped as invalid; see the module doc)."""
    to_openai = openai_names([f["name"] for f in functions])
    tools: list[dict[str, Any]] = []
    dropped: list[str] = []
    for function in functions:
        name = to_openai[function["name"]]
        parameters, lost = convert_bfcl_schema(function.get("parameters") or {"type": "dict"})
        dropped += [f"{name}.{path}" for path in lost]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": function.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    return tools, to_openai, dropped


def openai_names(bfcl_names: Sequence[str]) -> dict[str, str]:
    """BFCL name -> an OpenAI-valid name, unique within the list."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for original in bfcl_names:
        if original in out:
            continue
        base = re.sub(r"[^a-zA-Z0-9_-]", "_", original)[:64] or "tool"
        name, suffix = base, 2
        while name in taken:  # e.g. "a.b" next to "a_b"
            tail = f"_{suffix}"
            name, suffix = base[: 64 - len(tail)] + tail, suffix + 1
        assert _OPENAI_NAME.match(name)
        out[original] = name
        taken.add(name)
    return out


# ---------------------------------------------------------------- schema conversion


def convert_bfcl_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """BFCL parameter schema -> (JSON Schema, paths of defaults dropped as invalid)."""
    dropped: list[str] = []
    converted = _convert(schema, "", dropped)
    converted["type"] = "object"  # tool arguments are always an object
    converted.setdefault("properties", {})
    return converted, dropped


def _convert(schema: Mapping[str, Any], path: str, dropped: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword == "optional":
            continue  # BFCL-only; `required` says the same in JSON Schema terms
        if keyword == "type":
            json_type = BFCL_TYPES.get(value) if isinstance(value, str) else None
            if json_type is not None:
                out["type"] = json_type
        elif keyword == "properties" and isinstance(value, Mapping):
            out["properties"] = {
                name: _convert(sub, _join(path, name), dropped) for name, sub in value.items()
            }
        elif keyword == "items" and isinstance(value, Mapping):
            out["items"] = _convert(value, path + "[]", dropped)
        elif keyword == "additionalProperties" and isinstance(value, Mapping):
            out["additionalProperties"] = _convert(value, path + "{}", dropped)
        else:
            out[keyword] = value
    if out.get("type") == "array" and _is_scalar_enum(out.get("enum")) and "items" in out:
        # Some BFCL docs put the items' enum on the array, which no array can satisfy.
        items = out["items"] = dict(out["items"])
        items.setdefault("enum", out.pop("enum"))
    if "default" in out:
        without_default = {k: v for k, v in out.items() if k != "default"}
        if validate_arguments(out["default"], without_default):
            del out["default"]
            dropped.append(path or "$")
    return out


def _is_scalar_enum(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, list | dict) for v in value)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
