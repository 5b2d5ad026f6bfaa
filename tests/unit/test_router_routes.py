"""The `Router` deployment's own FastAPI routes, served in-process with a scripted MainModel
handle (no Ray): every POST route of the app runs the shared request checks and answers
through `RequestFlow` (app/api/request_flow.py). Adding a POST route that skips them fails
`test_every_post_route_runs_the_shared_checks`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient

from app.speculation.turn import TurnDelta, TurnEvent
from deployments.router import Router, api
from tests.unit.turns import turn_result


class ScriptedMain:
    """A MainModel handle: `generate.remote(...)` streams 'ok' and records the payload."""

    def __init__(self) -> None:
        self.generate = self
        self.count_tokens = _Count()
        self.payloads: list[dict[str, Any]] = []

    def options(self, **_: Any) -> ScriptedMain:
        return self

    def remote(self, payload: dict[str, Any], call_sidecar: bool,
               raw_prompt: Any = None) -> AsyncIterator[TurnEvent]:
        self.payloads.append(payload)

        async def events() -> AsyncIterator[TurnEvent]:
            yield TurnDelta("ok")
            yield turn_result([], "ok", text="ok")

        return events()


class _Count:
    """`count_tokens.remote(payload=...)`: 7 tokens for any prompt."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    async def remote(self, payload: dict[str, Any]) -> int:
        self.payloads.append(payload)
        return 7


@pytest.fixture()
def served() -> Iterator[tuple[TestClient, Any, ScriptedMain]]:
    # The class Serve wraps: built directly, as a replica would build it, without Ray.
    wrapper = Router.func_or_class
    cls = next(k for k in wrapper.__mro__[1:] if k.__name__ == "Router")
    main = ScriptedMain()
    router = cls.__new__(cls)
    cls.__init__(router, {}, main, None)
    replica = mock.Mock(servable_object=router)
    with mock.patch("ray.serve.get_replica_context", return_value=replica):
        yield TestClient(api), router, main


def post_paths() -> list[str]:
    return sorted(r.path for r in api.routes if "POST" in getattr(r, "methods", ()))


def test_every_post_route_runs_the_shared_checks(
    served: tuple[TestClient, Any, ScriptedMain],
) -> None:
    client, router, main = served
    deep: dict[str, Any] = {"a": 1}
    for _ in range(80):
        deep = {"a": deep}
    assert len(post_paths()) >= 3
    for path in post_paths():
        r = client.post(path, content=json.dumps({"metadata": deep}))
        assert r.status_code == 400, (path, r.text)
        if path.startswith("/v1/messages"):  # Anthropic's envelope: no code
            assert r.json()["type"] == "error", r.text
            assert "nested" in r.json()["error"]["message"], r.text
        else:
            assert r.json()["error"]["code"] == "body_too_deep", (path, r.text)
        assert router.flow.limiter.in_flight("anonymous") == 0, path
    assert main.payloads == []


@pytest.mark.parametrize(("path", "body", "param", "code"), [
    ("/v1/completions", {"prompt": "a", "stop": [""]}, "stop", "empty_stop_string"),
    ("/v1/completions", {"prompt": "a", "seed": 2**64}, "seed", None),
    ("/v1/completions", {"prompt": "a", "seed": 2**63 - 1, "n": 2}, "seed", "seed_out_of_range"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "seed": 2**63 - 1, "n": 2}, "seed", "seed_out_of_range"),
])
def test_bad_values_are_400s_naming_the_field(
    served: tuple[TestClient, Any, ScriptedMain], path: str, body: dict[str, Any],
    param: str, code: str | None,
) -> None:
    client, _, main = served
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    if code is not None:
        assert r.json()["error"]["code"] == code
    assert main.payloads == []


def test_each_route_answers_through_the_flow(
    served: tuple[TestClient, Any, ScriptedMain],
) -> None:
    client, router, main = served
    text = client.post("/v1/completions", json={"prompt": "a", "n": 2, "seed": 3}).json()
    assert [c["text"] for c in text["choices"]] == ["ok", "ok"]
    assert sorted(p["seed"] for p in main.payloads) == [3, 4]
    stream = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
    response = client.post("/v1/responses", json={"input": "hi"}).json()
    assert response["output"][0]["content"][0]["text"] == "ok"
    assert client.get("/v1/models").json()["data"][0]["id"] == router.chat.model_name
    model = router.chat.model_name
    asked = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    message = client.post("/v1/messages", json=asked).json()
    assert message["content"] == [{"type": "text", "text": "ok"}], message
    assert message["stop_reason"] == "end_turn"
    streamed = client.post("/v1/messages", json={**asked, "stream": True})
    assert streamed.text.startswith("event: message_start")
    assert streamed.text.rstrip().endswith('data: {"type": "message_stop"}')
    del asked["max_tokens"]
    counted = client.post("/v1/messages/count_tokens", json=asked)
    assert counted.json() == {"input_tokens": 7} and main.count_tokens.payloads
    bad = client.post("/v1/messages", json=asked)  # no max_tokens
    assert bad.status_code == 400 and bad.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: Field required"}}
    assert router.flow.limiter.in_flight("anonymous") == 0  # every slot released
