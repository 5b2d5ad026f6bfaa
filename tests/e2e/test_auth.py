"""API keys on a real router: a side app (tests/e2e/cluster.py) with one key in its config and
one in its environment, bound to the session app's engines, so the session app stays open."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import APIStatusError, AuthenticationError, OpenAI

from tests.e2e.cluster import GOOD, MODEL, chat, delete_side_app, deploy_side_app, wait_for

pytestmark = pytest.mark.e2e

CONFIG_KEY = "cfg-key-0123456789"
ENV_KEY = "env-key-9876543210"
SIDE = "side-auth"
LONG = {**GOOD, "tool_choice": "auto", "max_tokens": 300, "stream": True,
        "messages": [{"role": "user", "content": "Tell a long story. Do not call tools."}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def side_url(app_url: str) -> Iterator[str]:
    overrides = {"auth": {"api_keys": [{"key": CONFIG_KEY, "name": "ci", "max_concurrent": 1}],
                          "retry_after_s": 2}}
    url = deploy_side_app(SIDE, app_url, overrides, env={"OOO_SPEC_API_KEYS": ENV_KEY})
    try:
        yield url
    finally:
        delete_side_app(SIDE)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-key-xyz"},
                                     {"Authorization": CONFIG_KEY}],
                         ids=["none", "wrong", "no-scheme"])
def test_without_a_valid_key_every_v1_route_is_401(side_url: str,
                                                   headers: dict[str, str]) -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/v1/tools"),
                         ("GET", f"/v1/models/{MODEL}"), ("POST", "/v1/chat/completions")]:
        r = httpx.request(method, f"{side_url}{path}", json=GOOD, headers=headers, timeout=30)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert CONFIG_KEY not in r.text
    assert httpx.get(f"{side_url}/healthz", timeout=30).status_code == 200  # probes stay open


def test_config_and_env_keys_work_through_the_openai_client(side_url: str) -> None:
    for key in (CONFIG_KEY, ENV_KEY):
        client = OpenAI(base_url=f"{side_url}/v1", api_key=key, timeout=180, max_retries=0)
        response = client.chat.completions.create(
            model=MODEL, messages=GOOD["messages"], tools=GOOD["tools"],
            tool_choice="required", temperature=0, max_tokens=32)
        assert response.choices[0].message.tool_calls
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{side_url}/v1", api_key="nope-nope-nope",
               max_retries=0).models.list()


def test_per_key_concurrency_limit_is_429_with_retry_after(side_url: str) -> None:
    url = f"{side_url}/v1/chat/completions"
    with httpx.Client(timeout=180) as client:
        with client.stream("POST", url, json=LONG, headers=bearer(CONFIG_KEY)) as held:
            assert held.status_code == 200  # holds the key's one slot while it streams
            second = chat(side_url, GOOD, headers=bearer(CONFIG_KEY))
            assert second.status_code == 429, second.text
            assert second.headers["retry-after"] == "2"
            assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
            assert "'ci'" in second.json()["error"]["message"]
            # Another key has slots of its own.
            assert chat(side_url, GOOD, headers=bearer(ENV_KEY)).status_code == 200
            with pytest.raises(APIStatusError) as caught:
                OpenAI(base_url=f"{side_url}/v1", api_key=CONFIG_KEY, max_retries=0
                       ).chat.completions.create(model=MODEL, messages=GOOD["messages"],
                                                 max_tokens=4)
            assert caught.value.status_code == 429
    # The client left mid-stream: its slot is free again.
    wait_for("the slot released", lambda: chat(
        side_url, GOOD, headers=bearer(CONFIG_KEY)).status_code == 200, 60, every_s=1)
