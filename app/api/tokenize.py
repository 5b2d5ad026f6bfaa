"""`POST /tokenize` and `POST /detokenize` with vLLM's request and response shapes
(vllm/entrypoints/serve/tokenize/protocol.py), through the same checks and keys as the other
POST routes (app/api/request_checks.py `ROUTES`).

`/tokenize` takes a `prompt` (tokenized as is, `add_special_tokens` true by default) or
`messages` (the main model's chat template with the request's `tools`, exactly as a chat
completion renders them; `add_generation_prompt` on, as vLLM's default); it answers `count`,
`max_model_len`, `tokens` and, with `return_token_strs`, `token_strs`. `/detokenize` takes
`tokens` and answers `prompt`. vLLM's options this server cannot honour (a request's own
`chat_template`, `continue_final_message`, multimodal kwargs) are 400s naming them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.openai_models import ChatCompletionRequest, ChatMessage, ToolDef

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizeRequest(_Strict):
    """vLLM's `TokenizeCompletionRequest` | `TokenizeChatRequest` in one model: exactly one of
    `prompt` and `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's default: true for a prompt, false for messages (the template adds them).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' and 'messages'")
        if self.messages is None and (self.tools or self.chat_template_kwargs):
            raise ValueError("'tools' and 'chat_template_kwargs' go with 'messages'")
        if self.messages is not None:
            if self.add_special_tokens:
                raise ValueError("'add_special_tokens' with 'messages' is not supported: the "
                                 "chat template adds the model's special tokens")
            if self.continue_final_message or not self.add_generation_prompt:
                raise ValueError("only the chat prompt a completion decodes from is tokenized "
                                 "here ('add_generation_prompt' true, 'continue_final_message'"
                                 " false)")
        return self

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request it renders as (messages), or one holding the prompt (what the
        shared limits count)."""
        messages = self.messages or [ChatMessage(role="user", content=self.prompt or "")]
        return ChatCompletionRequest(messages=messages, tools=self.tools,
                                     chat_template_kwargs=self.chat_template_kwargs,
                                     max_tokens=1)

    @property
    def special_tokens(self) -> bool:
        return self.add_special_tokens if self.add_special_tokens is not None \
            else self.prompt is not None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)

    @field_validator("tokens")
    @classmethod
    def _token_ids(cls, tokens: list[int]) -> list[int]:
        if any(t < 0 or t > 2**63 - 1 for t in tokens):
            raise ValueError("'tokens' are token ids: non-negative integers")
        return tokens

    def chat_request(self) -> ChatCompletionRequest:
        """Nothing rendered: a one-token chat request for the shared limits."""
        return ChatCompletionRequest(messages=[ChatMessage(role="user", content="")],
                                     max_tokens=1)


def tokenize_response(tokens: list[int], max_model_len: int,
                      token_strs: list[str] | None) -> dict[str, Any]:
    """vLLM's `TokenizeResponse`."""
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
            "token_strs": token_strs}
