"""The parser names config accepts (app/vllm_names.py) are exactly vLLM's registries' names."""

from __future__ import annotations

from app.vllm_names import REASONING_PARSERS, TOOL_PARSERS, check_tool_parser


def test_tool_parser_names_are_vllms() -> None:
    from vllm.tool_parsers import ToolParserManager

    registered = set(ToolParserManager.tool_parsers) | set(ToolParserManager.lazy_parsers)
    assert set(TOOL_PARSERS) == registered
    assert len(TOOL_PARSERS) == len(set(TOOL_PARSERS)) == 54


def test_reasoning_parser_names_are_vllms() -> None:
    from vllm.reasoning import ReasoningParserManager

    registered = (set(ReasoningParserManager.reasoning_parsers)
                  | set(ReasoningParserManager.lazy_parsers))
    assert set(REASONING_PARSERS) == registered
    assert len(REASONING_PARSERS) == 38


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    import pytest

    with pytest.raises(ValueError, match="qwen_xml.*qwen3_xml"):
        check_tool_parser("qwen_xml")
