"""Degradation on the real deployment: a sidecar that hangs, fails, answers garbage or dies, a
tool worker that hangs or dies, a main replica that dies, a client that walks away.

Each test asserts what the client gets, then that the app serves a normal request again. Faults
are armed through the deployments' test-only handle methods (the session app runs with
`faults.enabled`); replicas are killed with `ray.kill`, and the tests wait until Serve has
replaced them, so the tests after these see a whole app."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.e2e.cluster import (
    GOOD,
    TOOL,
    call,
    chat,
    counters,
    idle,
    kill_replica,
    replaced,
    serves_normally,
    wait_for,
)

pytestmark = pytest.mark.e2e

# Long enough that the main model is still decoding when a replica is killed.
LONG = {"messages": [{"role": "user", "content": "Write a long story about a dragon who "
                      "learns to fly. Do not call any tool."}],
        "tools": [TOOL], "tool_choice": "auto", "temperature": 0, "max_tokens": 120}


@pytest.fixture
def clean_faults(app_url: str) -> Iterator[None]:
    yield
    call("Sidecar", "clear_faults")
    call("ToolWorker", "clear_faults")


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def with_spec(body: dict[str, Any], enabled: bool) -> dict[str, Any]:
    # History candidates off: what the main replica gets is the sidecar's alone.
    return {**body, "ooo_spec": {"enabled": enabled, "history": False}}


def message(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["choices"][0]["message"]
    return result


def report(response: httpx.Response) -> dict[str, Any]:
    result: dict[str, Any] = response.json()["ooo_spec"]
    return result


@pytest.mark.parametrize("kind", ["garbage", "error"])
def test_sidecar_garbage_or_error_falls_back_to_plain_decoding(
    app_url: str, clean_faults: None, kind: str
) -> None:
    plain = chat(app_url, with_spec(GOOD, False))
    call("Sidecar", "inject_fault", kind, 120)
    faulty = chat(app_url, with_spec(GOOD, True))
    assert report(faulty)["outcome"] == "sidecar_error"
    assert report(faulty)["candidates"] == []
    assert message(faulty)["tool_calls"][0]["function"] == message(plain)["tool_calls"][0][
        "function"]
    assert call("Sidecar", "fault_status")["hits"] >= 1
    call("Sidecar", "clear_faults")
    assert report(chat(app_url, with_spec(GOOD, True)))["outcome"] != "sidecar_error"


def test_sidecar_wrong_call_is_drafted_and_rejected_losslessly(
    app_url: str, clean_faults: None
) -> None:
    plain = chat(app_url, with_spec(GOOD, False))
    call("Sidecar", "inject_fault", "wrong_call", 120)
    faulty = chat(app_url, with_spec(GOOD, True))
    spec = report(faulty)
    assert spec["candidates"] and spec["candidates"][0]["valid"], spec
    assert spec["candidates"][0]["arguments"] == {"key": "zq-wrong-guess-zq"}
    assert spec["outcome"] in ("miss", "partial"), spec
    # The main model verified every drafted token: its output is plain decoding's.
    assert message(faulty)["tool_calls"][0]["function"] == message(plain)["tool_calls"][0][
        "function"]


def test_sidecar_hang_is_cut_off_and_the_hung_call_cancelled(
    app_url: str, clean_faults: None
) -> None:
    call("Sidecar", "inject_fault", "hang", 120)
    faulty = chat(app_url, with_spec(GOOD, True))
    # Answered while the sidecar still hangs (its fault holds the call for 120 s): cut off.
    assert report(faulty)["outcome"] == "sidecar_late"
    assert message(faulty)["tool_calls"]
    # The router cancels the sidecar call once the main model is done: nothing stays hung.
    wait_for("the hung sidecar call cancelled",
             lambda: call("Sidecar", "fault_status")["waiting"] == 0, 60)


def test_sidecar_replica_dies_mid_request(
    app_url: str, clean_faults: None, pool: ThreadPoolExecutor
) -> None:
    plain = chat(app_url, with_spec(LONG, False))
    call("Sidecar", "inject_fault", "hang", 300)  # holds the call until the kill
    future = pool.submit(chat, app_url, with_spec(LONG, True))
    wait_for("sidecar holding the call", lambda: call("Sidecar", "fault_status")["waiting"],
             60, every_s=0.1)
    wait_for("main decoding", lambda: counters("MainModel")["unfinished"], 60, every_s=0.1)
    old = kill_replica("Sidecar")
    faulty = future.result(timeout=180)
    assert report(faulty)["outcome"] == "sidecar_error", report(faulty)
    assert message(faulty)["content"] == message(plain)["content"]
    # While Serve restarts it, requests are answered (they do not wait for the sidecar).
    during = chat(app_url, with_spec(GOOD, True))
    assert message(during)["tool_calls"]
    replaced("Sidecar", old)
    wait_for("speculation back", lambda: report(chat(app_url, with_spec(GOOD, True)))[
        "outcome"] not in ("sidecar_error",), 120, every_s=2)


def test_main_replica_dies_mid_request_is_a_clear_503(
    app_url: str, pool: ThreadPoolExecutor
) -> None:
    future = pool.submit(chat, app_url, with_spec(LONG, False))
    wait_for("main decoding", lambda: counters("MainModel")["unfinished"], 60, every_s=0.1)
    old = kill_replica("MainModel")
    response = future.result(timeout=120)  # a bound on the wait, not a claim on speed
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "main_unavailable"
    assert "main model is unavailable" in error["message"]
    replaced("MainModel", old)
    serves_normally(app_url, timeout_s=300)


def calculator_request(app_url: str) -> dict[str, Any]:
    entry = next(t for t in httpx.get(f"{app_url}/v1/tools", timeout=30).json()["data"]
                 if t["function"]["name"] == "calculator")
    return {
        "messages": [{"role": "user", "content": "What is 6*7? Use the calculator."}],
        "tools": [{"type": "function", "function": entry["function"]}],
        "tool_choice": {"type": "function", "function": {"name": "calculator"}},
        "temperature": 0, "max_tokens": 48,
        # No pre-execution: the call the worker holds when the fault hits must be the
        # committed one (a killed pre-executed prediction would leave the committed call to
        # run on the fresh replica, fault-free).
        "ooo_spec": {"enabled": True, "execute_tools": True, "max_steps": 1,
                     "pre_execute": False, "server_tools": True},
    }


def test_tool_worker_hang_gives_an_error_result(app_url: str, clean_faults: None) -> None:
    body = calculator_request(app_url)
    call("ToolWorker", "inject_fault", "hang", 300)
    response = chat(app_url, body)
    assert response.status_code == 200, response.text
    results = report(response)["tool_results"]
    assert results and results[0]["name"] == "calculator"
    # The worker holds the call for 300 s: an answer that says so is the router's timeout
    # (calculator's own 2 s plus the router's grace) cutting it off, not the hang ending.
    assert "did not answer" in results[0]["content"], results
    call("ToolWorker", "clear_faults")
    healthy = report(chat(app_url, body))["tool_results"]
    assert healthy and "did not answer" not in healthy[0]["content"], healthy


def test_tool_worker_dies_mid_call_gives_an_error_result(
    app_url: str, clean_faults: None, pool: ThreadPoolExecutor
) -> None:
    body = calculator_request(app_url)
    call("ToolWorker", "inject_fault", "hang", 300)
    future = pool.submit(chat, app_url, body)
    wait_for("worker holding a call", lambda: call("ToolWorker", "fault_status")["waiting"],
             120, every_s=0.2)
    old = kill_replica("ToolWorker")
    response = future.result(timeout=120)
    assert response.status_code == 200, response.text
    results = report(response)["tool_results"]
    assert results and "could not run" in results[0]["content"], results
    replaced("ToolWorker", old, timeout_s=120)
    healthy = wait_for("tools back", lambda: report(chat(app_url, body))["tool_results"], 120)
    assert "could not run" not in healthy[0]["content"], healthy


def open_request(app_url: str, body: dict[str, Any]) -> socket.socket:
    """A raw HTTP request whose connection the test can drop at a moment of its choosing."""
    address = urlparse(app_url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((address.hostname, address.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain-response"])
def test_client_disconnect_aborts_main_and_sidecar(
    app_url: str, clean_faults: None, stream: bool
) -> None:
    """A client that leaves mid-request: the engines' own counters show both generations
    aborted (not run to the end) and nothing left behind. The sidecar is made slow (a long
    generation of its own first), so it is surely still generating when the client leaves."""
    call("Sidecar", "inject_fault", "slow", 300)
    # Start from idle engines, so the busy engines below are this request's.
    before = {d: wait_for(f"{d} idle", lambda d=d: (c if idle(c := counters(d)) else None), 60)
              for d in ("MainModel", "Sidecar")}
    body = {**with_spec(LONG, True), "max_tokens": 400, "stream": stream}

    def both_busy() -> bool:
        return all(counters(d)["unfinished"] > 0 for d in ("MainModel", "Sidecar"))

    sock = open_request(app_url, body)
    try:
        wait_for("main and sidecar generating", both_busy, 60, every_s=0.05)
    finally:
        sock.close()
    for deployment in ("MainModel", "Sidecar"):
        def settled(name: str = deployment) -> dict[str, int] | None:
            now = counters(name)
            return now if idle(now) else None

        after = wait_for(f"{deployment} idle", settled, 30, every_s=0.2)
        assert after["aborted"] > before[deployment]["aborted"], (deployment, before, after)
    serves_normally(app_url, timeout_s=60)
