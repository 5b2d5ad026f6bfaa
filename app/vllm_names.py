"""The names vLLM 0.32 registers for `--tool-call-parser` and `--reasoning-parser`.

`main.engine.tool_format` and `main.engine.reasoning_parser` take any of them. They are kept
here as plain tuples because importing vLLM's registries takes tens of seconds, too long for
loading a config; tests/unit/test_vllm_names.py checks them against vLLM's own tables
(`vllm/tool_parsers/__init__.py`, `vllm/reasoning/__init__.py`), so an upgrade of vLLM that
adds or renames a parser fails there first.
"""

from __future__ import annotations

TOOL_PARSERS: tuple[str, ...] = (
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31",
    "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots", "ernie45", "functiongemma",
    "gemma4", "gigachat3", "glm45", "glm47", "granite", "granite-20b-fc", "granite4",
    "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json",
    "llama4_pythonic", "longcat", "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral",
    "muse_glimmer", "olmo3", "openai", "phi4_mini_json", "plamo3", "poolside_v1", "pythonic",
    "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5", "xlam",
)

REASONING_PARSERS: tuple[str, ...] = (
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4",
    "deepseek_v41", "ernie45", "gemma4", "glm45", "glm47", "granite",
    "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling",
    "k2_horizon", "kimi_k2", "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3",
    "olmo3", "openai_gptoss", "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3",
    "step3p5",
)


def check_tool_parser(name: str) -> str:
    """`name` when vLLM has a tool parser of that name; a ValueError naming them otherwise."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool format {name!r}: not a vLLM 0.32 tool parser "
                         f"(--tool-call-parser); known: {', '.join(TOOL_PARSERS)}")
    return name


def check_reasoning_parser(name: str | None) -> str | None:
    if name is not None and name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}: not a vLLM 0.32 reasoning "
                         f"parser (--reasoning-parser); known: {', '.join(REASONING_PARSERS)}")
    return name
