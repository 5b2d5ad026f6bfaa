"""The router's copy of the main model's tool format (app/api/main_format.py): a vLLM-read
format loads its tokenizer and vLLM's parser off the event loop, once."""

from __future__ import annotations

import asyncio

from app.api import main_format as mf
from app.config import EngineConfig


def test_a_hand_written_format_needs_no_loading() -> None:
    engine = EngineConfig(model="embedded", tool_format="hermes")
    assert mf.warm_main_format(engine) is None
    assert mf.main_format(engine).name == "hermes"


async def test_a_vllm_read_format_loads_once_without_holding_the_event_loop() -> None:
    engine = EngineConfig(model="embedded", tool_format="qwen3_coder")
    mf._loaded.cache_clear()
    during_load = 0
    loaded = asyncio.Event()

    async def ticker() -> None:
        nonlocal during_load
        while not loaded.is_set():
            during_load += mf._loading.locked()  # held only while the format loads
            await asyncio.sleep(0)

    running = asyncio.ensure_future(ticker())
    first, second = await asyncio.gather(mf.main_format_async(engine),
                                         mf.main_format_async(engine))
    loaded.set()
    await running
    assert first is second is mf.main_format(engine)
    assert first.vllm_backed and first.name == "qwen3_coder"
    assert mf._loaded.cache_info().misses == 1  # two requests at once: one load
    assert during_load > 0  # the loop kept serving while the tokenizer loaded


def test_the_routers_warm_up_loads_it_before_any_request() -> None:
    engine = EngineConfig(model="embedded", tool_format="qwen3_coder")
    mf._loaded.cache_clear()
    warm = mf.warm_main_format(engine)
    assert warm is not None
    warm.join()
    assert mf._loaded.cache_info().misses == 1
    assert mf.main_format(engine).name == "qwen3_coder"
    assert mf._loaded.cache_info().misses == 1


def test_parsers_get_the_tokenizer_as_vllm_serve_hands_it_over() -> None:
    """A parser is made per request and reads the vocabulary as it is made: the router's
    tokenizer keeps it (vLLM's cached wrapper) rather than rebuilding it each time."""
    engine = EngineConfig(model="embedded", tool_format="qwen3_coder")
    fmt = mf.main_format(engine)
    tokenizer = fmt.tokenizer  # type: ignore[attr-defined]
    assert tokenizer.get_vocab() is tokenizer.get_vocab()
    assert tokenizer.chat_template  # the template survives the wrapping
