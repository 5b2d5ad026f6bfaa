"""Known models configured for you (issue 41, item 6): `tool_format` and `reasoning_parser`
left out of the config are filled from the model's name, with the parsers vLLM's recipes run
the family with; every name is one vLLM 0.32 registers."""

from __future__ import annotations

import pytest

from app.config import KNOWN_MODELS, AppConfig, EngineConfig, known_model_defaults


def test_every_name_is_registered_by_vllm() -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tools = set(ToolParserManager.tool_parsers) | set(ToolParserManager.lazy_parsers)
    reasoning = (set(ReasoningParserManager.reasoning_parsers)
                 | set(ReasoningParserManager.lazy_parsers))
    for words, tool_format, parser in KNOWN_MODELS:
        assert tool_format in tools, (words, tool_format)
        assert parser is None or parser in reasoning, (words, parser)


@pytest.mark.parametrize(("model", "expected"), [
    ("Qwen/Qwen3-8B", ("hermes", "qwen3")),
    ("Qwen/Qwen3-0.6B", ("hermes", "qwen3")),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", ("qwen3_coder", None)),
    ("Qwen/Qwen3.5-397B-A17B", ("qwen3_coder", "qwen3")),
    ("Qwen/Qwen2.5-7B-Instruct", ("hermes", None)),
    ("openai/gpt-oss-120b", ("openai", "openai_gptoss")),
    ("zai-org/GLM-4.5-Air", ("glm45", "glm45")),
    ("zai-org/GLM-4.6", ("glm45", "glm45")),
    ("zai-org/GLM-4.7", ("glm47", "glm45")),
    ("moonshotai/Kimi-K2-Instruct-0905", ("kimi_k2", "kimi_k2")),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", ("deepseek_v31", "deepseek_v3")),
    ("deepseek-ai/DeepSeek-V3.2-Exp", ("deepseek_v32", "deepseek_v3")),
    ("MiniMaxAI/MiniMax-M2", ("minimax_m2", "minimax_m2_append_think")),
    ("mistralai/Devstral-Small-2507", ("mistral", None)),
    ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", ("mistral", None)),
    ("mistralai/Magistral-Small-2509", ("mistral", "mistral")),
    ("meta-llama/Llama-3.1-8B-Instruct", ("llama3_json", None)),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", ("llama4_pythonic", None)),
    ("google/gemma-4-31b-it", ("gemma4", "gemma4")),
    ("google/functiongemma-270m-it", ("functiongemma", None)),
    ("/models/qwen3_8b/", ("hermes", "qwen3")),  # a local folder, case and `_` blind
    ("embedded", None),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", None),
])
def test_known_model_defaults(model: str, expected: tuple[str, str | None] | None) -> None:
    assert known_model_defaults(model) == expected


def test_the_config_fills_only_what_is_left_out() -> None:
    engine = EngineConfig(model="Qwen/Qwen3-8B")
    assert (engine.tool_format, engine.reasoning_parser) == ("hermes", "qwen3")
    assert "reasoning_parser" not in engine.model_fields_set  # still the user's to set
    off = EngineConfig(model="Qwen/Qwen3-8B", reasoning_parser=None)
    assert off.reasoning_parser is None  # set on purpose: kept
    # The served name counts too (a local folder with another name).
    assert EngineConfig(model="/srv/weights", served_model_name="qwen3-8b").reasoning_parser \
        == "qwen3"
    # A name this version of the config does not take yet keeps the default.
    coder = AppConfig.model_validate({"main": {"engine": {"model": "Qwen/Qwen3-Coder-30B"}}})
    assert coder.main.engine.tool_format in ("hermes", "qwen3_coder")
    assert EngineConfig().tool_format == "hermes" and EngineConfig().reasoning_parser is None


def test_config_check_names_how_forced_calls_are_made_and_warns_off_recipe() -> None:
    from app.config_check import DeploymentReport, check_tool_format

    def checked(**engine: object) -> DeploymentReport:
        dep = DeploymentReport(name="MainModel", actor={}, actor_from="test")
        check_tool_format(dep, EngineConfig.model_validate(engine))
        return dep

    qwen = checked(model="Qwen/Qwen3-8B")
    assert qwen.forced_calls == "in the model's format, structural tag 'hermes' " \
        "(tool_strict_level auto)"
    assert qwen.warnings == []
    assert checked(model="Qwen/Qwen3-8B", tool_structural_tags=False).forced_calls == \
        "JSON fallback (main.engine.tool_structural_tags: false)"
    llama = checked(model="meta-llama/Llama-3.1-8B-Instruct", tool_format="pythonic")
    assert llama.forced_calls == "JSON fallback (vLLM has no structural tag for 'pythonic')"
    assert len(llama.warnings) == 1 and "--tool-call-parser llama3_json" in llama.warnings[0]
    glm = checked(model="zai-org/GLM-4.7", reasoning_parser="qwen3")
    assert any("--reasoning-parser glm45" in w for w in glm.warnings)
