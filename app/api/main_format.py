"""The main model's tool format as the router reads streamed outputs with it.

The four hand-written formats need nothing more than their name. A format read by vLLM's
own parser (app/formats/tool_formats/vllm_format.py) needs the main model's tokenizer (and
chat template): the router loads it once, on the first request that streams, from the same
model folder the engine loads (the tokenizer only: no weights, no engine).
"""

from __future__ import annotations

from functools import cache

from app.config import EngineConfig
from app.formats.tool_formats import ToolFormat, get_format


@cache
def _loaded(model: str, tool_format: str, chat_template: str | None) -> ToolFormat:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import resolve_model_path
    from app.formats.tool_formats.families import load_chat_template

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    if chat_template is not None:
        tokenizer.chat_template = load_chat_template(chat_template)
    return get_format(tool_format, tokenizer)


def main_format(engine: EngineConfig) -> ToolFormat:
    """`engine.tool_format`, bound to the model's tokenizer when vLLM's parser reads it."""
    fmt = get_format(engine.tool_format)
    if not fmt.vllm_backed:
        return fmt
    return _loaded(engine.model, engine.tool_format, engine.chat_template)
