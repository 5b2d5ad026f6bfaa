"""End to end: `ooo_spec.baseline: "ngram"` reaches the second main engine (vLLM's own n-gram
speculation, deployed in the test app by tests/conftest.py) and is lossless: the same output as
plain decoding on the main engine, token for token, through the real `openai` client."""

from __future__ import annotations

import pytest

from load_tests.bfcl import load_bfcl

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"


def _run(client, case, options: dict) -> tuple:  # type: ignore[no-untyped-def]
    response = client.chat.completions.create(
        model=MODEL,
        messages=case.messages,
        tools=case.tools,
        tool_choice="required",
        temperature=0,
        max_tokens=128,
        extra_body={"ooo_spec": options},
    )
    message = response.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return (message.content, calls, response.choices[0].finish_reason), response


def test_ngram_baseline_is_identical_to_plain(openai_client) -> None:  # type: ignore[no-untyped-def]
    cases = load_bfcl("simple_python", 2) + load_bfcl("multiple", 1)
    for case in cases:
        plain, plain_response = _run(openai_client, case, {"enabled": False})
        ngram, ngram_response = _run(openai_client, case, {"baseline": "ngram"})
        assert ngram == plain, case.id
        assert plain[1], f"{case.id}: no tool call to compare"
        report = ngram_response.model_extra["ooo_spec"]
        assert report["baseline"] == "ngram" and report["enabled"] is False
        assert report["candidates"] == []  # no sidecar ran
        steps, tokens = report["main"]["steps"], report["main"]["completion_tokens"]
        assert tokens == plain_response.usage.completion_tokens
        # Each pass commits one token plus the drafts it accepted: never more passes.
        assert 1 <= steps <= plain_response.model_extra["ooo_spec"]["main"]["steps"]
        assert report["main"]["accepted_tokens"] == tokens - steps
        assert plain_response.model_extra["ooo_spec"]["baseline"] is None
