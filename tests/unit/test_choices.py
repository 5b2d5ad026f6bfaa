"""`n` > 1 (one request per choice, merged) and logprobs shaping, without a model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.chat_service import choice_requests, merge_completions, stream_sse
from app.api.errors import ApiError
from app.formats.logprobs import TokenLogprobs, chat_logprobs, completion_logprobs
from app.openai_models import ChatCompletionRequest


def request(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **extra})


def completion(text: str, tokens: int, logprobs: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    return {
        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop",
                     "logprobs": {"content": logprobs} if logprobs is not None else None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens,
                  "total_tokens": 10 + tokens, "prompt_tokens_details": {"cached_tokens": 6}},
        "ooo_spec": {"outcome": "disabled", "text": text},
    }


async def events(text: str, tokens: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    for part in text:
        yield "delta", {"text": part}
    yield "final", completion(text, tokens)


def test_choice_requests_seed_like_vllm() -> None:
    one = choice_requests(request(n=3, seed=7))
    assert [r.seed for r in one] == [7, 8, 9] and all(r.n is None for r in one)
    assert [r.seed for r in choice_requests(request(n=2))] == [None, None]
    assert choice_requests(request())[0].n is None


def test_merge_counts_the_prompt_once() -> None:
    merged = merge_completions([completion("a", 3), completion("b", 4)])
    assert [c["index"] for c in merged["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in merged["choices"]] == ["a", "b"]
    assert merged["usage"] == {"prompt_tokens": 10, "completion_tokens": 7,
                               "total_tokens": 17, "prompt_tokens_details": {"cached_tokens": 6}}


async def collect(stream: AsyncIterator[str]) -> list[Any]:
    out = []
    async for line in stream:
        body = line.removeprefix("data: ").strip()
        out.append(body if body == "[DONE]" else json.loads(body))
    return out


async def test_stream_of_two_choices() -> None:
    req = request(n=2, stream=True, stream_options={"include_usage": True})
    chunks = await collect(stream_sse(req, [events("ab", 2), events("xyz", 3)], "m"))
    assert chunks[-1] == "[DONE]"
    text: dict[int, str] = {0: "", 1: ""}
    for c in chunks[:-1]:
        for choice in c["choices"]:
            text[choice["index"]] += choice["delta"].get("content", "")
    assert text == {0: "ab", 1: "xyz"}
    finishes = [c["choices"][0]["index"] for c in chunks[:-1]
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == [0, 1]
    assert chunks[-2]["usage"]["completion_tokens"] == 5 and "ooo_spec" in chunks[-2]
    assert len({c["id"] for c in chunks[:-1]}) == 1


async def test_one_choice_stream_keeps_its_shape() -> None:
    chunks = await collect(stream_sse(request(stream=True), events("ab", 2), "m"))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "ooo_spec" in chunks[-2]


async def test_a_failing_choice_ends_the_stream_with_its_error() -> None:
    async def failing() -> AsyncIterator[tuple[str, dict[str, Any]]]:
        yield "delta", {"text": "a"}
        raise ApiError(503, "main model down")

    chunks = await collect(stream_sse(request(n=2, stream=True),
                                      [events("ab", 2), failing()], "m"))
    assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["message"] == "main model down"


@pytest.mark.parametrize("extra, words", [
    ({"top_logprobs": 2}, "'logprobs' must be set"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"),
])
def test_bad_logprobs_and_n(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        request(**extra)


TOKENS = [
    # sampled 5 is the top-1: not repeated
    TokenLogprobs(5, ((5, -0.1, "He"), (6, -2.5, "Hi"))),
    # sampled 9 is not the top-1: first, then the top ones (vLLM's order)
    TokenLogprobs(9, ((9, -3.0, "llo"), (7, -0.2, "y"), (8, float("-inf"), None))),
]


def test_chat_logprobs_like_vllm() -> None:
    content = chat_logprobs(TOKENS, 2, lambda t: f"<{t}>")
    assert content[0] == {"token": "He", "logprob": -0.1, "bytes": [72, 101], "top_logprobs": [
        {"token": "He", "logprob": -0.1, "bytes": [72, 101]},
        {"token": "Hi", "logprob": -2.5, "bytes": [72, 105]}]}
    assert [t["token"] for t in content[1]["top_logprobs"]] == ["llo", "y"]
    assert chat_logprobs(TOKENS, 3, str)[1]["top_logprobs"][2] == {
        "token": "8", "logprob": -9999.0, "bytes": [56]}
    assert chat_logprobs(TOKENS, 0, str)[0]["top_logprobs"] == []


def test_completion_logprobs_are_parallel_lists() -> None:
    out = completion_logprobs(TOKENS, 1, str, offset=4)
    assert out["tokens"] == ["He", "llo"] and out["token_logprobs"] == [-0.1, -3.0]
    assert out["text_offset"] == [4, 6]
    assert out["top_logprobs"] == [{"He": -0.1, "Hi": -2.5}, {"llo": -3.0, "y": -0.2}]
