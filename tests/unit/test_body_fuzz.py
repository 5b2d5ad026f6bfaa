"""Property-based fuzz of every POST route's request checks, in-process (issue 39): bodies
drawn from each route's request model's JSON Schema, valid and mutated (tests/request_bodies.py),
through the same `check_body` the router runs, and through the router's FastAPI app with a
scripted main model. No body may get a 5xx, and none may reach the checks' safety net
(`checking`'s 400 `check_failed`, for an exception nobody foresaw): every refusal is one a
check meant to give. Each run reports how many bodies it sent and what became of them."""

from __future__ import annotations

import json
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
from app.api.request_checks import ROUTES, Bounds, check_body
from app.api.responses import ResponsesRequest
from app.api.work import WorkPlan
from app.config import LimitsConfig
from app.openai_models import ChatCompletionRequest
from deployments.router import Router, api
from tests.request_bodies import bodies, from_json_schema
from tests.unit.test_router_routes import ScriptedMain

MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
}
# The sidecar deployed in slots mode: the work count reads the tools' schemas.
BOUNDS = Bounds(LimitsConfig(), 1_000_000, 2048, work=WorkPlan(True, 32))
CHECK_BODIES = 1000  # per route
APP_BODIES = 150  # per route, through the app
FUZZ = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def valid(path: str) -> st.SearchStrategy[dict[str, Any]]:
    return from_json_schema(MODELS[path].model_json_schema())


def test_every_post_route_is_fuzzed() -> None:
    assert set(MODELS) == set(ROUTES)


def test_valid_bodies_are_mostly_accepted() -> None:
    # The generator draws what the models take (else the fuzz would only probe the parse).
    @settings(FUZZ, max_examples=60)
    @given(body=valid("/v1/completions"))
    def run(body: dict[str, Any]) -> None:
        try:
            check_body(ROUTES["/v1/completions"], json.dumps(body).encode(), BOUNDS)
            outcomes["accepted"] += 1
        except ApiError:
            outcomes["refused"] += 1

    outcomes: Counter[str] = Counter()
    run()
    assert outcomes["accepted"] >= 10, outcomes


@pytest.mark.parametrize("path", sorted(MODELS))
def test_no_body_gets_past_the_checks_unforeseen(path: str) -> None:
    outcomes: Counter[str] = Counter()

    @settings(FUZZ, max_examples=CHECK_BODIES)
    @given(body=bodies(valid(path)))
    def run(body: bytes) -> None:
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
    assert sum(outcomes.values()) >= CHECK_BODIES
    assert outcomes["accepted"] > 0 and len(outcomes) > 4, outcomes


@pytest.fixture()
def served() -> Iterator[tuple[TestClient, Any]]:
    wrapper = Router.func_or_class
    cls = next(k for k in wrapper.__mro__[1:] if k.__name__ == "Router")
    router = cls.__new__(cls)
    cls.__init__(router, {}, ScriptedMain(), None)
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
        if response.status_code >= 400:
            assert response.json()["error"]["code"] != "check_failed", response.text
        statuses[response.status_code] += 1

    run()
    print(f"{path}: {sum(statuses.values())} bodies through the app: {dict(statuses)}")
    assert router.flow.limiter.in_flight("anonymous") == 0  # every slot released
    good = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
            "/v1/completions": {"prompt": "hi"}, "/v1/responses": {"input": "hi"}}[path]
    assert client.post(path, json=good).status_code == 200  # and it still serves
