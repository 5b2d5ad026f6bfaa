"""The requests and checks of the Locust load test (load_tests/locustfile.py), kept apart from
Locust itself: importing locust patches the standard library for gevent, which the unit tests
of these functions must not suffer."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from load_tests.bfcl import BfclCase
from load_tests.bfcl_multi import MultiTurnStep

PARALLEL = frozenset({"parallel", "parallel_multiple"})
REQUEST_TIMEOUT_S = 300.0  # the router's own deadline; slowness under load is not an error


def settings() -> dict[str, Any]:
    categories = os.environ.get(
        "OOO_SPEC_LOAD_CATEGORIES", "simple_python,multiple,parallel,parallel_multiple")
    modes = os.environ.get("OOO_SPEC_LOAD_MODES", "ooo")
    return {
        "categories": [c.strip() for c in categories.split(",") if c.strip()],
        "limit": int(os.environ.get("OOO_SPEC_LOAD_LIMIT", "100")),
        "modes": [m.strip() for m in modes.split(",") if m.strip()],
        "max_tokens": int(os.environ.get("OOO_SPEC_LOAD_MAX_TOKENS", "256")),
    }


def request_body(case: BfclCase | MultiTurnStep, mode: str, max_tokens: int) -> dict[str, Any]:
    if mode not in ("ooo", "plain"):
        raise ValueError(f"OOO_SPEC_LOAD_MODES: unknown mode {mode!r} (ooo or plain)")
    body: dict[str, Any] = {
        "messages": case.messages,
        "tools": case.tools,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": max_tokens,
        "ooo_spec": {"enabled": mode == "ooo"},
    }
    if case.category in PARALLEL:
        body["parallel_tool_calls"] = True
    return body


def check_completion(status: int, text: str, error: object = None) -> str | None:
    """None when the reply is a usable completion, else why it is a failure. `status` 0 is
    no reply at all (`error` says why: refused, reset, timed out)."""
    if status == 0:
        return f"no reply: {error!r}"
    if status != 200:
        return f"HTTP {status}: {text[:200]}"
    try:
        body = json.loads(text)
        choice = body["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"not a chat.completion: {text[:200]}"
    if body.get("object") != "chat.completion" or "ooo_spec" not in body:
        return "reply lacks object=chat.completion or the ooo_spec report"
    if not choice["message"].get("tool_calls") and choice.get("finish_reason") != "length":
        return f"no tool call (finish_reason={choice.get('finish_reason')})"
    return None


def summary_line(
    requests: int,
    failures: int,
    elapsed_s: float,
    percentiles_ms: Mapping[float, float],
    max_ms: float,
) -> str:
    """The one line `make loadtest` ends with."""
    shown = ", ".join(f"p{round(q * 100)} {ms:.0f} ms" for q, ms in sorted(percentiles_ms.items()))
    return (
        f"loadtest: {requests} requests, {failures} errors, "
        f"{requests / elapsed_s:.2f} req/s over {elapsed_s:.0f} s; latency {shown}, "
        f"max {max_ms:.0f} ms"
    )
