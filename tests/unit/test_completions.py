"""/v1/completions logic with a fake main model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.api.completions import CompletionRequest, CompletionService
from app.api.errors import ApiError
from app.api.request_checks import COMPLETIONS, Bounds, check_body
from app.config import LimitsConfig
from app.openai_models import MainReport
from app.speculation.turn import TurnDelta, TurnError, TurnEvent, TurnResult
from tests.unit.turns import turn_result


def final(text: str, prompt_tokens: int = 4) -> TurnResult:
    return turn_result([], text, text=text, finish_reason="length", prompt_tokens=prompt_tokens,
                       completion_tokens=len(text),
                       main=MainReport(steps=len(text), completion_tokens=len(text),
                                       ttft_ms=1.0, decode_ms=2.0))


def fake_main(seen: list[tuple[dict[str, Any], Any]]):
    async def main_events(payload: dict[str, Any], prompt: Any) -> AsyncIterator[TurnEvent]:
        seen.append((payload, prompt))
        text = f"<{prompt}|{payload.get('seed')}>"
        for part in (text[:2], text[2:]):
            yield TurnDelta(part)
        yield final(text)
    return main_events


def parse(**data: Any) -> CompletionRequest:
    bounds = Bounds(LimitsConfig(), 100_000, 2048)
    return check_body(COMPLETIONS, json.dumps(data).encode(), bounds).request


async def test_prompts_times_n_choices_in_order() -> None:
    seen: list[tuple[dict[str, Any], Any]] = []
    request = parse(prompt=["a", "b"], n=2, seed=5, max_tokens=8)
    out = await CompletionService("m").complete(request, fake_main(seen))
    assert [c["text"] for c in out["choices"]] == ["<a|5>", "<a|6>", "<b|5>", "<b|6>"]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == 8  # each prompt once
    payload = seen[0][0]
    assert payload["max_tokens"] == 8 and payload["ooo_spec"]["history"] is False


async def test_stream_chunks_then_usage_then_done() -> None:
    request = parse(prompt=[1, 2, 3], stream=True, stream_options={"include_usage": True})
    lines = [line async for line in CompletionService("m").stream(request, fake_main([]), 60)]
    bodies = [line.removeprefix("data: ").strip() for line in lines]
    assert bodies[-1] == "[DONE]"
    chunks = [json.loads(b) for b in bodies[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "<[1, 2, 3]|None>"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == len("<[1, 2, 3]|None>")
    assert "ooo_spec" in chunks[-1]


async def test_an_error_before_any_text_is_raised() -> None:
    async def failing(payload: dict[str, Any], prompt: Any) -> AsyncIterator[TurnEvent]:
        raise TurnError("too long", param="prompt", code="context_length_exceeded")
        yield  # an async generator

    stream = CompletionService("m").stream(parse(prompt="x", stream=True), failing, 60)
    with pytest.raises(ApiError) as err:
        await anext(stream)
    assert err.value.status == 400


@pytest.mark.parametrize("data, words", [
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "max_tokens": 5000}, "at most"),
    ({"prompt": "x", "n": 9}, "at most 8"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "json_schema"),
    ({"max_tokens": 3}, "prompt"),
])
def test_bad_requests_are_400s(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(**data)
    assert err.value.status == 400 and words in err.value.message, err.value.message


def test_defaults_like_vllm() -> None:
    request = parse(prompt="x", logprobs=2)
    assert request.max_tokens == 16
    chat = request.chat_request(0)
    assert chat.logprobs is True and chat.top_logprobs == 2
