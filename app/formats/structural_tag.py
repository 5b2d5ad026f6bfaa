"""Tool calls constrained in the model's own format: xgrammar structural tags, as vLLM 0.32.

vLLM's tool parsers name a structural-tag model (`ToolParser.structural_tag_model`); for
`tool_choice: required`, a named tool and `strict: true` tools, vLLM's serving layer then
constrains the output with the structural tag of that model
(`vllm/tool_parsers/structural_tag_registry.py`, xgrammar's `get_model_structural_tag`): the
model writes its calls in its own format (`<tool_call>` JSON for hermes, `<function=...>`
XML for qwen3_coder, ...), and the format's parser reads them. Formats without a structural
tag keep the JSON fallback (app/formats/tool_format.py: a JSON list of calls, one call for a
named tool).

When a tag applies follows vLLM (`resolve_tool_strictness`, `--tool-strict-level`,
`main.engine.tool_strict_level`):
- `auto` (the default): forced calls (`required`, a named tool) always; `tool_choice: auto`
  only when a tool is `strict: true` or the client set `parallel_tool_calls: false`; in auto,
  a tool's arguments are pinned to its schema only when the tool is `strict: true`, otherwise
  only the call's envelope (markers, tool names) is constrained;
- `function`: the envelope of every auto request with tools too, arguments as `auto`;
- `parameter`: as `function`, and every tool's arguments pinned to its schema.
Three differences from vLLM: a forced call's arguments are always pinned to the tool's schema
(vLLM leaves a non-strict tool's free at `auto`; the JSON fallback always pinned them, and the
sidecar's predictions, the schema drafts and the router's checks assume calls that follow the
schema); several calls in a forced turn only when the client asked for parallel calls (as the
JSON fallback: small models under a list grammar repeat a call until `max_tokens`); and in
`auto` no tag while the model may think first (the engine does not lift a grammar while a
reasoning block is open, as vLLM's structured-output manager does).

The tag is handed to the engine as the EBNF xgrammar builds from it, with whitespace bounded
like the JSON grammars (app/formats/json_grammar.py, `main.json_max_indent`), or as the tag
itself when that is off; the grammar check (app/formats/grammar_check.py) compiles either
with a CPU-time limit before the engine sees it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from app.config import EngineConfig
from app.formats.json_grammar import GrammarError, bound_whitespace
from app.formats.tool_formats import get_format

StrictLevel = Literal["auto", "function", "parameter"]

# vLLM 0.32's tool parsers (`--tool-call-parser`) by their structural-tag model, read from
# each parser class's `structural_tag_model` (tests/unit/test_structural_tag.py checks it
# against vLLM). `harmony` (gpt-oss) is built by vLLM's harmony parser module, which registers
# it on import (`_call_tag` imports it). Left out: `hy_v4` (its tag needs a per-checkpoint
# token suffix read from the tokenizer).
STRUCTURAL_TAG_MODELS: dict[str, str] = {
    "deepseek_v3": "deepseek_r1",
    "deepseek_v31": "deepseek_v3_1",
    "deepseek_v32": "deepseek_v3_2",
    "deepseek_v4": "deepseek_v4",
    "deepseek_v41": "deepseek_v4_1",
    "glm45": "glm_4_7",
    "glm47": "glm_4_7",
    "hermes": "hermes",
    "kimi_k2": "kimi",
    "kimi_k3": "kimi_k3",
    "ling3": "glm_4_7",
    "llama3_json": "llama",
    "llama4_json": "llama",
    "longcat": "longcat",
    "mimo": "mimo",
    "minimax_m2": "minimax",
    "openai": "harmony",
    "plamo3": "plamo3",
    "qwen3_coder": "qwen_3_coder",
    "qwen3_json": "hermes",
    "qwen3_xml": "qwen_3_coder",
    "step3p5": "qwen_3_coder",
}


def structural_tag_model(vllm_parser: str) -> str | None:
    """The structural-tag model of vLLM's tool parser of that name; None: forced calls use
    the JSON fallback."""
    return STRUCTURAL_TAG_MODELS.get(vllm_parser)


def wants_tag(mode: str, tools: list[dict[str, Any]], parallel: bool | None,
              strict_level: StrictLevel) -> bool:
    """Whether a request's calls are constrained by a structural tag at all (given its format
    has one): vLLM's `resolve_tool_strictness` plus its rule for `parallel_tool_calls: false`.

    >>> wants_tag("auto", [{"function": {"name": "f"}}], None, "auto")
    False
    >>> wants_tag("auto", [{"function": {"name": "f", "strict": True}}], None, "auto")
    True
    >>> wants_tag("required", [{"function": {"name": "f"}}], None, "auto")
    True
    """
    if mode in ("required", "named"):
        return True
    if mode != "auto" or not tools:
        return False
    if strict_level != "auto" or parallel is False:
        return True
    return any(t["function"].get("strict") is True for t in tools)


def call_tag(
    model: str, tools: list[dict[str, Any]], mode: str, named: str | None,
    parallel: bool | None, strict_level: StrictLevel,
) -> str:
    """The structural tag (its JSON) that constrains a request's calls, built by vLLM's own
    registry. `mode`: 'auto', 'required' or 'named'. A GrammarError when the tools cannot be
    made into one (the request's fault)."""
    return _call_tag(model, json.dumps(tools), mode, named, parallel, strict_level)


@lru_cache(maxsize=256)
def _call_tag(
    model: str, tools_json: str, mode: str, named: str | None, parallel: bool | None,
    strict_level: StrictLevel,
) -> str:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolsParam,
    )
    from vllm.tool_parsers.structural_tag_registry import (
        get_model_structural_tag,
        limit_to_single_tool_call,
    )
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    if model == "harmony":
        import vllm.parser.harmony  # noqa: F401 - registers the harmony builder, as vllm serve

    level = ToolStrictLevel.from_name(strict_level)
    if mode != "auto":  # forced calls: arguments pinned, as the JSON fallback
        level = ToolStrictLevel.PARAMETER
    if parallel is False:  # vLLM: limiting the call count needs the envelope in the grammar
        level = max(level, ToolStrictLevel.FUNCTION)
    choice: Any = mode
    if mode == "named":
        choice = ChatCompletionNamedToolChoiceParam.model_validate(
            {"type": "function", "function": {"name": named}})
    try:
        params = [ChatCompletionToolsParam.model_validate(t) for t in json.loads(tools_json)]
        tag = get_model_structural_tag(model, params, choice, reasoning=False,
                                       strict_level=level)
    except Exception as exc:  # noqa: BLE001 - pydantic, ValueError, VLLMValidationError
        raise GrammarError(f"the tools cannot be made into a structural tag: {exc}") from None
    if tag is None:
        raise GrammarError("no structural tag applies to these tools")
    # Several forced calls only when the client asked for parallel calls (small models under
    # a list grammar repeat the same call until max_tokens); in auto as vLLM: when it said no.
    if parallel is False or (mode != "auto" and parallel is not True):
        limit_to_single_tool_call(tag)
    return str(tag.model_dump_json())


# Structural-tag models whose vLLM parsers read a call's arguments with a `.*` that stops at
# a newline (deepseek_v3's and deepseek_v31's regexes have no DOTALL): a call whose JSON spans
# lines is no call at all there, its text lost too (tests/unit/test_structural_tag.py shows
# it). Their models write arguments on one line; forced calls keep them there.
ONE_LINE_ARGUMENTS = frozenset({"deepseek_r1", "deepseek_v3_1"})


@lru_cache(maxsize=256)
def tag_grammar(tag_json: str, max_indent: int, one_line: bool = False) -> str:
    """The EBNF xgrammar builds from a structural tag, its whitespace bounded as the JSON
    grammars' (app/formats/json_grammar.py); `one_line`: arguments without newlines."""
    import xgrammar as xgr

    try:
        ebnf = str(xgr.Grammar.from_structural_tag(tag_json))
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError
        raise GrammarError(f"the structural tag cannot be compiled into a grammar: {exc}") \
            from None
    return bound_whitespace(ebnf, max_indent, one_line)


def engine_tag_model(engine: EngineConfig) -> str | None:
    """The structural-tag model the main model's calls are constrained with
    (`main.engine.tool_format`, `tool_structural_tags`); None: forced calls are JSON."""
    if not engine.tool_structural_tags:
        return None
    return structural_tag_model(get_format(engine.tool_format).vllm_parser)
