"""`main.engine.chat_template` reaches the prompts the engine's tokenizer renders
(`app.engine.vllm_engine.with_chat_template`): vLLM's renderer pools copies of the tokenizer
when the engine starts, and the pool, not the attribute, renders chats."""

from __future__ import annotations

from app.engine.embedded_model import embedded_model_dir
from app.engine.vllm_engine import with_chat_template
from app.formats.tool_formats.families import load_chat_template

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}}}}]


def _pooled() -> object:
    """The tokenizer as the engine's renderer holds it (vllm/renderers/hf.py)."""
    from vllm.tokenizers import get_tokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    return maybe_make_thread_pool(get_tokenizer(str(embedded_model_dir())), 2)


def _render(tokenizer: object) -> str:
    return str(tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True))


def test_the_pool_renders_with_the_configured_template() -> None:
    template = load_chat_template("qwen3_coder")
    plain = _pooled()
    own = _render(plain)
    # The attribute alone does not reach the pool's copies: what the engine did before.
    plain.chat_template = template  # type: ignore[attr-defined]
    assert _render(plain) == own
    templated = with_chat_template(_pooled(), template)
    text = _render(templated)
    assert text != own and "<function=NAME>" in text
    assert templated.chat_template == template
    assert templated.encode("hi") == _pooled().encode("hi")  # the same tokenizer otherwise
