"""The main model's tool format as the router reads streamed outputs with it.

The four hand-written formats need nothing more than their name. A format read by vLLM's
own parser (app/formats/tool_formats/vllm_format.py) needs the main model's tokenizer (and
chat template): the router loads it once, from the same model folder the engine loads (the
tokenizer only: no weights, no engine). That takes seconds (vLLM's parser modules import with
it), so it starts in a thread when the router starts (`warm_main_format`) and a request that
streams before it is done waits for it off the event loop (`main_format_async`).
"""

from __future__ import annotations

import asyncio
import threading
from functools import cache

from app.config import EngineConfig
from app.formats.tool_formats import ToolFormat, get_format

_loading = threading.Lock()  # one load, however many requests ask at once


@cache
def _loaded(model: str, tool_format: str, chat_template: str | None) -> ToolFormat:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import get_cached_tokenizer

    from app.engine.embedded_model import resolve_model_path
    from app.formats.tool_formats.families import load_chat_template

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    if chat_template is not None:
        tokenizer.chat_template = load_chat_template(chat_template)
    # As `vllm serve` hands it to parsers: a parser is made per request and reads the
    # vocabulary as it is made, which a bare tokenizer rebuilds each time (~30 ms for 49k
    # tokens, more for today's 150k+ vocabularies).
    return get_format(tool_format, get_cached_tokenizer(tokenizer))


def main_format(engine: EngineConfig) -> ToolFormat:
    """`engine.tool_format`, bound to the model's tokenizer when vLLM's parser reads it."""
    fmt = get_format(engine.tool_format)
    if not fmt.vllm_backed:
        return fmt
    with _loading:
        return _loaded(engine.model, engine.tool_format, engine.chat_template)


async def main_format_async(engine: EngineConfig) -> ToolFormat:
    """`main_format` without holding the event loop while a vLLM-read format loads."""
    fmt = get_format(engine.tool_format)
    if not fmt.vllm_backed:
        return fmt
    return await asyncio.to_thread(main_format, engine)


def warm_main_format(engine: EngineConfig) -> threading.Thread | None:
    """Start loading a vLLM-read format in a thread (None: the format needs no loading).
    A failure here is the first streamed request's to report."""
    if not get_format(engine.tool_format).vllm_backed:
        return None

    def load() -> None:
        try:
            main_format(engine)
        except Exception:  # noqa: BLE001 - the request that needs it raises it again
            pass

    thread = threading.Thread(target=load, name="main-format", daemon=True)
    thread.start()
    return thread
