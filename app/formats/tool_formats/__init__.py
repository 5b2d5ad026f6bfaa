"""Tool-call formats by name (`main.engine.tool_format`), like vLLM's `--tool-call-parser`.

- `hermes`: Hermes 2 Pro, Qwen2.5, Qwen3; SmolLM2 under the fallback prompt.
  `<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`
- `llama3_json`: Llama 3.1-3.3, Llama 4 (JSON mode). `{"name": .., "parameters": {..}}`
- `mistral`: Mistral 7B Instruct v0.3 (pre-v11 tokenizers).
  `[TOOL_CALLS][{"name": .., "arguments": {..}}]`
- `pythonic`: Llama 3.2 / 4 (pythonic), ToolACE. `[get_weather(city='Paris')]`
"""

from __future__ import annotations

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, ToolFormat
from app.formats.tool_formats.hermes import HermesFormat
from app.formats.tool_formats.llama3_json import Llama3JsonFormat
from app.formats.tool_formats.mistral import MistralFormat
from app.formats.tool_formats.pythonic import PythonicFormat

FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (HermesFormat(), Llama3JsonFormat(), MistralFormat(), PythonicFormat())
}


def get_format(name: str) -> ToolFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool format {name!r}; known: {', '.join(sorted(FORMATS))}"
        ) from None


__all__ = ["FORMATS", "ParsedCall", "ParsedOutput", "ToolFormat", "get_format"]
