"""Token log-probabilities as vLLM's OpenAI server returns them.

The engine reports, per generated token, an ordered list of (token id, logprob, decoded text):
the sampled token first, then the top-k by rank (the sampled one is not repeated when it is
among them). vLLM's chat server (`_create_chat_logprobs`) writes each token's own logprob and
takes the first `top_logprobs` entries of that list as `top_logprobs`, logprobs clamped at
-9999; the completions server (`_create_completion_logprobs`) writes the same as parallel lists.
With speculation the values come from the verifying pass: vLLM's rejection sampler reports the
target model's logprobs of the accepted tokens: plain decoding's up to float32 rounding (a
verifying pass computes several positions at once; the largest difference seen was 4e-5,
tests/integration/test_lossless.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# What vLLM puts for -inf.
FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token: its id and the engine's ordered (id, logprob, text) entries."""

    token_id: int
    entries: tuple[tuple[int, float, str | None], ...]


def from_engine(token_ids: list[int], positions: Iterable[Mapping[int, Any]] | None
                ) -> list[TokenLogprobs]:
    """Plain values out of vLLM's per-position `{token_id: Logprob}` dicts."""
    if positions is None:
        return []
    return [
        TokenLogprobs(token_id, tuple((tid, float(lp.logprob), lp.decoded_token)
                                      for tid, lp in position.items()))
        for token_id, position in zip(token_ids, positions, strict=False)
    ]


def _text(token_id: int, decoded: str | None, decode: Callable[[int], str]) -> str:
    return decoded if decoded is not None else decode(token_id)


def chat_logprobs(
    tokens: list[TokenLogprobs], top: int, decode: Callable[[int], str]
) -> list[dict[str, Any]]:
    """The `logprobs.content` list of a chat choice (or of one stream chunk)."""
    content: list[dict[str, Any]] = []
    for token in tokens:
        own = next((e for e in token.entries if e[0] == token.token_id), None)
        if own is None:
            text = decode(token.token_id)
            content.append({"token": text, "logprob": FLOOR, "bytes": list(text.encode()),
                            "top_logprobs": []})
            continue
        text = _text(own[0], own[2], decode)
        content.append({
            "token": text,
            "logprob": max(own[1], FLOOR),
            "bytes": list(text.encode("utf-8", errors="replace")),
            "top_logprobs": [
                {"token": (t := _text(tid, dec, decode)), "logprob": max(lp, FLOOR),
                 "bytes": list(t.encode("utf-8", errors="replace"))}
                for tid, lp, dec in token.entries[:top]
            ],
        })
    return content


def completion_logprobs(
    tokens: list[TokenLogprobs], top: int, decode: Callable[[int], str], offset: int = 0
) -> dict[str, Any]:
    """The `logprobs` object of a /v1/completions choice: parallel lists, and
    `text_offset` (characters from `offset`, where this part of the text starts)."""
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [],
                           "top_logprobs": []}
    position = offset
    for token in tokens:
        own = next((e for e in token.entries if e[0] == token.token_id), None)
        text = _text(token.token_id, own[2] if own else None, decode)
        out["tokens"].append(text)
        out["token_logprobs"].append(max(own[1], FLOOR) if own else None)
        # vLLM writes `top + 1` entries here (the OpenAI spec's "up to logprobs + 1").
        out["top_logprobs"].append({
            _text(tid, dec, decode): max(lp, FLOOR) for tid, lp, dec in token.entries[:top + 1]
        })
        out["text_offset"].append(position)
        position += len(text)
    return out
