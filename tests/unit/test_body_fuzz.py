"""Property-based fuzz of every POST route's request checks, in-process (issue 39): bodies
drawn from each route's request model's JSON Schema, valid and mutated (tests/request_bodies.py),
through the same `check_body` the router runs, and through the router's FastAPI app with a
scripted main model. No body may get a 5xx, and none may reach the checks' safety net
(`checking`'s 400 `check_failed`, for an exception nobody foresaw): every refusal is one a
check meant to give. Each run reports how many bodies it sent and what became of them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.api.completions import CompletionRequest
from app.api.errors import ApiError
from app.api.messages import (
    COUNT_TOKENS_PATH,
    MESSAGES_PATH,
    CountTokensRequest,
    MessagesRequest,
)
from app.api.request_checks import ROUTES, Bounds, check_body
from app.api.responses import ResponsesRequest
from app.api.tokenize import DETOKENIZE_PATH, TOKENIZE_PATH, DetokenizeRequest, TokenizeRequest
from app.api.work import WorkPlan
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest
from deployments.router import Router, api
from tests.request_bodies import TYPICAL, batches, bodies, from_json_schema
from tests.unit.test_router_routes import ScriptedMain

MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    MESSAGES_PATH: MessagesRequest,
    COUNT_TOKENS_PATH: CountTokensRequest,
    TOKENIZE_PATH: TokenizeRequest,
    DETOKENIZE_PATH: DetokenizeRequest,
}
# The sidecar deployed in slots mode: the work count reads the tools' schemas.
BOUNDS = Bounds(LimitsConfig(), 1_000_000, 2048, work=WorkPlan(True, 32))
CHECK_DRAWS = 100  # per route, each a batch of 10 bodies
APP_BODIES = 30  # per route, through the app
FUZZ = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def valid(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """Valid by the route's model's JSON Schema, or a typical body the model takes."""
    by_schema = from_json_schema(MODELS[path].model_json_schema())
    return by_schema | TYPICAL[path] if path in TYPICAL else by_schema


def test_every_post_route_is_fuzzed() -> None:
    # A new POST route (in ROUTES, which the router's routes are held to) needs its model here.
    assert set(MODELS) == set(ROUTES)


@pytest.mark.parametrize("path", sorted(MODELS))
def test_no_body_gets_past_the_checks_unforeseen(path: str) -> None:
    outcomes: Counter[str] = Counter()

    @settings(FUZZ, max_examples=CHECK_DRAWS)
    @given(batch=batches(valid(path)))
    def run(batch: list[bytes]) -> None:
        for body in batch:
            try:
                check_body(ROUTES[path], body, BOUNDS)
            except ApiError as err:
                assert 400 <= err.status < 500, (err.status, err.message)
                assert err.code != "check_failed", (err.message, body[:400])
                outcomes[err.code or "invalid"] += 1
            else:
                outcomes["accepted"] += 1

    run()
    print(f"{path}: {sum(outcomes.values())} bodies through check_body: {dict(outcomes)}")
    assert sum(outcomes.values()) >= CHECK_DRAWS * 8
    assert outcomes["accepted"] > 0 and len(outcomes) > 4, outcomes


class Answers:
    """A MainModel method called with keywords that answers `value` (`MainModel.tokens`,
    `MainModel.count_tokens`)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    async def remote(self, **_: Any) -> Any:
        return self.value


class FuzzMain(ScriptedMain):
    """The scripted MainModel, with the tokenizer's calls too."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = Answers({"count": 1, "max_model_len": 2048, "tokens": [1]})
        self.count_tokens = Answers(1)


@pytest.fixture()
def served() -> Iterator[tuple[TestClient, Any]]:
    wrapper = Router.func_or_class
    cls = next(k for k in wrapper.__mro__[1:] if k.__name__ == "Router")
    router = cls.__new__(cls)
    cls.__init__(router, {}, FuzzMain(), None)
    replica = mock.Mock(servable_object=router)
    with mock.patch("ray.serve.get_replica_context", return_value=replica):
        yield TestClient(api, raise_server_exceptions=False), router


@pytest.mark.parametrize("path", sorted(MODELS))
def test_no_body_gets_a_5xx_from_the_app(served: tuple[TestClient, Any], path: str) -> None:
    client, router = served
    statuses: Counter[int] = Counter()

    @settings(FUZZ, max_examples=APP_BODIES)
    @given(body=bodies(valid(path)))
    def run(body: bytes) -> None:
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code < 500, (response.status_code, response.text[:300], body[:300])
        if response.status_code >= 400:  # OpenAI's error envelope, or Anthropic's
            assert "could not be checked" not in response.json()["error"]["message"], \
                response.text
        statuses[response.status_code] += 1

    run()
    print(f"{path}: {sum(statuses.values())} bodies through the app: {dict(statuses)}")
    assert router.flow.limiter.in_flight("anonymous") == 0  # every slot released
    still = client.post("/v1/chat/completions", json={"messages": [{"role": "user",
                                                                    "content": "hi"}]})
    assert still.status_code == 200, still.text  # and it still serves
