"""End to end: `ooo_spec.baseline: "ngram"` reaches a second main engine (vLLM's own n-gram
speculation) and is lossless: the same output as plain decoding on the main engine, token for
token, through the real `openai` client.

The n-gram engine lives in this file's side app only (tests/e2e/cluster.py), so the session
app, and every test that restarts it, does not start an engine only this test uses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from load_tests.bfcl import load_bfcl
from tests.e2e.cluster import delete_side_app, deploy_side_app, local_args, merge

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
SIDE = "side-ngram"
OVERRIDES = {"baselines": {"ngram": {"enabled": True}}}


@pytest.fixture(scope="module")
def ngram_client(app_url: str) -> Iterator[Any]:
    from openai import OpenAI

    from app.config import MAIN_NGRAM, load_config
    from app.main_model.baselines import NGRAM
    from deployments.main_model import MainModel

    shared = load_config(merge(local_args(), OVERRIDES)).model_dump(mode="json",
                                                                     exclude={"auth"})
    main_ngram = MainModel.options(  # type: ignore[attr-defined]
        name=MAIN_NGRAM, num_replicas=1, max_ongoing_requests=16,
        ray_actor_options={"num_cpus": 0}).bind(shared, NGRAM)
    url = deploy_side_app(SIDE, app_url, OVERRIDES, main_ngram=main_ngram)
    try:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    finally:
        delete_side_app(SIDE)


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


def test_ngram_baseline_is_identical_to_plain(ngram_client: Any) -> None:
    cases = load_bfcl("simple_python", 2) + load_bfcl("multiple", 1)
    for case in cases:
        plain, plain_response = _run(ngram_client, case, {"enabled": False})
        ngram, ngram_response = _run(ngram_client, case, {"baseline": "ngram"})
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


def test_a_server_without_the_engine_refuses_the_baseline(openai_client: Any) -> None:
    """The session app deploys no n-gram engine: asking for it is a clear 400, not a 5xx."""
    import openai

    case = load_bfcl("simple_python", 1)[0]
    with pytest.raises(openai.BadRequestError) as raised:
        _run(openai_client, case, {"baseline": "ngram"})
    assert raised.value.code == "baseline_not_deployed", raised.value.body
