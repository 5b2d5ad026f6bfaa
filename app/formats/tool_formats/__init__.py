"""Tool-call formats by name (`main.engine.tool_format`), like vLLM's `--tool-call-parser`.

- `hermes`: Hermes 2 Pro, Qwen2.5, Qwen3; SmolLM2 under the fallback prompt.
  `<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`
- `llama3_json`: Llama 3.1-3.3, Llama 4 (JSON mode). `{"name": .., "parameters": {..}}`
- `mistral`: Mistral 7B Instruct v0.3 (pre-v11 tokenizers).
  `[TOOL_CALLS][{"name": .., "arguments": {..}}]`
- `pythonic`: Llama 3.2 / 4 (pythonic), ToolACE. `[get_weather(city='Paris')]`

Every other vLLM 0.32 tool-parser name (`qwen3_coder`, `openai`, `glm47`, `kimi_k2`,
`deepseek_v31`, `minimax_m2`, ..., app/vllm_names.py), and `mistral` with a v11+
tokenizer (`[TOOL_CALLS]name[ARGS]{...}`), is a `VllmFormat`: read by vLLM's own parser of the
name, written through the model's chat template (app/formats/tool_formats/vllm_format.py).
The four above stay hand-written: the embedded model and tests run on tokenizers vLLM's
`llama3_json` and `mistral` parsers refuse (no `<|python_tag|>`, no `[TOOL_CALLS]` token), and
they write calls without a chat template that renders them.
"""

from __future__ import annotations

from typing import Any

from app.formats.tool_formats.base import ParsedCall, ParsedOutput, ToolFormat
from app.formats.tool_formats.hermes import HermesFormat
from app.formats.tool_formats.llama3_json import Llama3JsonFormat
from app.formats.tool_formats.mistral import MistralFormat
from app.formats.tool_formats.pythonic import PythonicFormat
from app.formats.tool_formats.vllm_format import VllmFormat
from app.vllm_names import check_tool_parser

FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (HermesFormat(), Llama3JsonFormat(), MistralFormat(), PythonicFormat())
}


# vLLM's mistral parser reads `[TOOL_CALLS]name[ARGS]{...}` when the tokenizer has `[ARGS]`
# (v11+) and the pre-v11 JSON list otherwise, which the hand-written format reads.
_V11_MARKER = "[ARGS]"


def get_format(name: str, tokenizer: Any = None, chat_template: str | None = None) -> ToolFormat:
    """The format of vLLM's tool parser `name`. `tokenizer` (and `chat_template`, when the
    model's is not the tokenizer's own): the main model's, which a `VllmFormat` reads and
    writes with; without it a `VllmFormat` can name itself and nothing more."""
    hand_written = FORMATS.get(name)
    if hand_written is not None and not (
        name == "mistral" and tokenizer is not None and _V11_MARKER in tokenizer.get_vocab()
    ):
        return hand_written
    return VllmFormat(check_tool_parser(name), tokenizer, chat_template)


__all__ = ["FORMATS", "ParsedCall", "ParsedOutput", "ToolFormat", "VllmFormat", "get_format"]
