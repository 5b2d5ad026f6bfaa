"""The load test's requests and reply checks (load_tests/load_requests.py), without Locust."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.openai_models import ChatCompletionRequest
from load_tests.load_requests import check_completion, request_body, settings, summary_line
from tests.unit.test_bench import make_case


def reply(tool_calls: list[dict[str, Any]] | None, finish: str = "tool_calls",
          **extra: Any) -> str:
    body: dict[str, Any] = {
        "object": "chat.completion", "ooo_spec": {"outcome": "hit"},
        "choices": [{"message": {"role": "assistant", "content": None,
                                 "tool_calls": tool_calls}, "finish_reason": finish}],
    }
    body.update(extra)
    return json.dumps(body)


def test_request_body_is_a_valid_request_for_every_category_and_mode() -> None:
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple"):
        for mode in ("ooo", "plain"):
            body = request_body(make_case(f"{category}_0", category), mode, 128)
            request = ChatCompletionRequest.model_validate(body)
            assert request.effective_tool_choice == "required"
            assert request.ooo_spec.enabled is (mode == "ooo")
            assert request.parallel_tool_calls is (True if "parallel" in category else None)
            assert request.max_tokens == 128 and request.temperature == 0
    with pytest.raises(ValueError, match="unknown mode"):
        request_body(make_case(), "ngram", 128)


def test_check_completion() -> None:
    call = [{"id": "call_1", "type": "function",
             "function": {"name": "area", "arguments": "{}"}}]
    assert check_completion(200, reply(call)) is None
    assert check_completion(200, reply(None, finish="length")) is None  # cut short, still valid
    assert "no tool call" in (check_completion(200, reply(None, finish="stop")) or "")
    assert (check_completion(503, '{"error": {"message": "busy"}}') or "").startswith("HTTP 503")
    assert "not a chat.completion" in (check_completion(200, "<html>") or "")
    refused = ConnectionRefusedError(111, "Connection refused")
    assert "Connection refused" in (check_completion(0, "", refused) or "")
    assert "ooo_spec" in (check_completion(200, reply(call, object="list")) or "")


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings()["categories"] == ["simple_python", "multiple", "parallel",
                                        "parallel_multiple"]
    monkeypatch.setenv("OOO_SPEC_LOAD_CATEGORIES", "simple_python, multiple")
    monkeypatch.setenv("OOO_SPEC_LOAD_MODES", "ooo,plain")
    monkeypatch.setenv("OOO_SPEC_LOAD_LIMIT", "7")
    got = settings()
    assert got["categories"] == ["simple_python", "multiple"]
    assert got["modes"] == ["ooo", "plain"] and got["limit"] == 7 and got["max_tokens"] == 256


def test_summary_line() -> None:
    line = summary_line(240, 0, 120.0, {0.99: 9000.0, 0.5: 4000.4}, 12000.0)
    assert line == ("loadtest: 240 requests, 0 errors, 2.00 req/s over 120 s; latency "
                    "p50 4000 ms, p99 9000 ms, max 12000 ms")
