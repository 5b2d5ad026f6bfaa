"""The baseline engines (vLLM's n-gram and suffix speculation) without a model: their config
sections, the service built for each, the bench config that deploys them, and how the chat
service routes and reports a request that asks for one (plus the per-request `pre_execute`
switch and `first_commit` timing)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.api.chat_service import ChatService
from app.api.errors import ApiError
from app.api.pre_execution import ToolPolicy
from app.config import AppConfig, EngineConfig, load_config
from app.config_check import check_application
from app.main_model import baselines
from app.main_model.baselines import baseline_service
from app.openai_models import ChatCompletionRequest
from tests.unit.test_agent_loop import (
    FakePool,
    ManualClock,
    Script,
    complete,
    final,
    lookup,
    request,
)

ROOT = Path(__file__).resolve().parents[2]


def app_args(name: str) -> dict[str, Any]:
    with open(ROOT / "configs" / name) as f:
        (application,) = yaml.safe_load(f)["applications"]
    args: dict[str, Any] = application["args"]
    return args


# ---------------------------------------------------------------- config


def test_ngram_section_defaults_off_and_builds_vllm_config() -> None:
    config = AppConfig()
    assert config.baselines.ngram.enabled is False
    assert config.baselines.deployed() == []
    ngram = load_config({"baselines": {"ngram": {"enabled": True, "prompt_lookup_max": 5}}})
    assert ngram.baselines.deployed() == ["ngram"]
    assert ngram.baselines.ngram.speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 16,
        "prompt_lookup_min": 2, "prompt_lookup_max": 5,
    }
    assert "MainModelNgram" in ngram.deployment_names()
    assert "MainModelNgram" not in config.deployment_names()


@pytest.mark.parametrize("section", [
    {"prompt_lookup_min": 5, "prompt_lookup_max": 2},
    {"num_speculative_tokens": 0},
    {"method": "eagle"},
])
def test_ngram_section_rejects(section: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        load_config({"baselines": {"ngram": section}})


def test_suffix_section_defaults_off_and_asks_vllm_for_its_defaults() -> None:
    assert AppConfig().baselines.suffix.enabled is False
    suffix = load_config({"baselines": {"suffix": {"enabled": True}}})
    assert suffix.baselines.deployed() == ["suffix"]
    # The method alone: tree depth, spec factor and the rest stay vLLM's defaults.
    assert suffix.baselines.suffix.speculative_config() == {"method": "suffix"}
    assert "MainModelSuffix" in suffix.deployment_names()
    assert "MainModelSuffix" not in AppConfig().deployment_names()
    both = load_config({"baselines": {"ngram": {"enabled": True},
                                      "suffix": {"enabled": True}}})
    assert both.baselines.deployed() == ["ngram", "suffix"]
    with pytest.raises(ValidationError):
        load_config({"baselines": {"suffix": {"suffix_decoding_max_tree_depth": 8}}})


def test_suffix_baseline_service_uses_vllm_suffix() -> None:
    config = load_config({"baselines": {"suffix": {"enabled": True}}})
    service = baseline_service(config, "suffix")  # not started: no model is loaded
    assert service.engine.speculation is None
    assert service.engine.vllm_speculative == {"method": "suffix"}
    assert service.engine.cfg == config.main.engine


def test_suffix_baseline_refused_clearly_without_arctic_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(baselines, "suffix_available", lambda: False)
    config = load_config({"baselines": {"suffix": {"enabled": True}}})
    with pytest.raises(RuntimeError, match="arctic-inference.*scripts/setup.sh"):
        baseline_service(config, "suffix")
    # The n-gram engine does not need it.
    baseline_service(load_config({"baselines": {"ngram": {"enabled": True}}}), "ngram")


def test_config_check_warns_where_suffix_decoding_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with open(ROOT / "configs" / "bench.yaml") as f:
        (application,) = yaml.safe_load(f)["applications"]
    monkeypatch.setattr("app.config_check.check.suffix_available", lambda: False)
    report = check_application(application)
    [suffix] = [d for d in report.deployments if d.name == "MainModelSuffix"]
    assert any("arctic-inference" in w for w in suffix.warnings)
    assert suffix.kv_cache is not None  # still sized like the other engines
    monkeypatch.setattr("app.config_check.check.suffix_available", lambda: True)
    [suffix] = [d for d in check_application(application).deployments
                if d.name == "MainModelSuffix"]
    assert not any("arctic-inference" in w for w in suffix.warnings)


# The engine settings the bench gives the model's full context (BFCL's multi-turn tools alone
# are 2,100-4,400 tokens); local.yaml keeps 2,048 (its e2e tests decode to the context's end).
BENCH_CONTEXT = {"max_model_len": 8192, "kv_cache_gib": 1.0}


def test_local_default_stays_light_and_bench_config_adds_only_the_baseline_engines() -> None:
    local, bench = app_args("local.yaml"), app_args("bench.yaml")
    assert load_config(local).baselines.deployed() == []
    assert load_config(bench).baselines.deployed() == ["ngram", "suffix"]
    # Same server otherwise, so the bench's plain and ooo numbers are the local default's.
    rest = copy.deepcopy(bench)
    rest.pop("baselines")
    # ... and per-mode suffix memories (diagnostics.suffix_scopes, off in the product: a
    # scope is a per-request diagnostic) ...
    assert rest.pop("diagnostics") == {"suffix_scopes": True}
    local.pop("diagnostics", None)
    # ... and the bench's own tool module (slow_lookup), which the product does not ship.
    assert rest.pop("tools") == [*local.pop("tools"), "load_tests.bench_tools"]
    for part in ("main", "sidecar"):
        engine = rest[part]["engine"]
        assert {k: engine.pop(k) for k in BENCH_CONTEXT} == BENCH_CONTEXT
        for key in BENCH_CONTEXT:
            local[part]["engine"].pop(key)
    assert rest == local, "configs/bench.yaml drifted from configs/local.yaml"
    with open(ROOT / "configs" / "local.yaml") as f:
        local_file = yaml.safe_load(f)
    with open(ROOT / "configs" / "bench.yaml") as f:
        bench_file = yaml.safe_load(f)
    for key in ("proxy_location", "http_options"):
        assert bench_file[key] == local_file[key]
    # The same deployment options, plus the baseline engine's.
    (local_app,), (bench_app,) = local_file["applications"], bench_file["applications"]
    extra = [d for d in bench_app["deployments"] if d not in local_app["deployments"]]
    assert [d["name"] for d in extra] == ["MainModelNgram", "MainModelSuffix"]
    # No core reserved: main and sidecar hold the two of the local box.
    assert all(d["ray_actor_options"] == {"num_cpus": 0} for d in extra)


def test_baseline_service_uses_vllm_ngram_not_the_candidate_proposer() -> None:
    config = load_config({"baselines": {"ngram": {"enabled": True}}})
    service = baseline_service(config, "ngram")  # not started: no model is loaded
    assert service.engine.speculation is None
    assert service.engine.vllm_speculative == config.baselines.ngram.speculative_config()
    assert service.engine.cfg == config.main.engine  # unset engine = the main one's settings
    own = EngineConfig(max_model_len=1024)
    config = load_config({"baselines": {"ngram": {"enabled": True,
                                                  "engine": own.model_dump()}}})
    service = baseline_service(config, "ngram")
    # The service's context limit comes from the engine that really decodes.
    assert service.engine.cfg == own and service.config.main.engine == own
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline_service(config, "eagle")


# ---------------------------------------------------------------- routing and reports


def ngram_request(**options: Any) -> ChatCompletionRequest:
    data = request().model_dump(exclude_none=True)
    data["ooo_spec"] = {"baseline": "ngram", **options}
    return ChatCompletionRequest.model_validate(data)


def test_baseline_not_deployed_is_a_clear_400() -> None:
    with pytest.raises(ApiError) as caught:
        ChatService("m", True).check_options(ngram_request())
    err = caught.value
    assert err.status == 400 and err.param == "ooo_spec.baseline"
    assert err.code == "baseline_not_deployed"
    assert "baselines.ngram.enabled" in err.message
    ChatService("m", True, baselines=["ngram"]).check_options(ngram_request())
    ChatService("m", True).check_options(request())  # no baseline asked: nothing to check


def test_unknown_baseline_is_rejected_by_the_request_model() -> None:
    data = request().model_dump(exclude_none=True)
    data["ooo_spec"] = {"baseline": "eagle"}
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(data)


async def test_baseline_request_runs_no_sidecar_and_says_which_engine_decoded() -> None:
    pool = FakePool()
    script = Script([final([lookup("a")])], predictions=[[lookup("a")]], decode_s=0.05)
    service = ChatService("m", True, pool, baselines=["ngram"])
    # `enabled` defaults to true; the baseline still wins: its engine has no proposer.
    out = await complete(service, ngram_request(), script)
    report = out["ooo_spec"]
    assert script.sidecar_payloads == [] and pool.calls == []
    assert report["enabled"] is False and report["outcome"] == "disabled"
    assert report["baseline"] == "ngram"
    # The payload the router routes by still names the baseline.
    assert script.payloads[0]["ooo_spec"]["baseline"] == "ngram"
    plain = await complete(ChatService("m", True, pool), request(),
                           Script([final([lookup("a")])], decode_s=0.01))
    assert plain["ooo_spec"]["baseline"] is None


async def test_pre_execute_false_waits_for_the_commit_even_on_a_right_prediction() -> None:
    pool = FakePool(lookup_s=0.05)
    finals = [final([lookup("a")]), final([], content="done")]
    data = request(execute_tools=True, max_steps=1).model_dump(exclude_none=True)
    data["ooo_spec"]["pre_execute"] = False
    req = ChatCompletionRequest.model_validate(data)
    out = await complete(ChatService("m", True, pool, policy=ToolPolicy()), req,
                         Script(finals, predictions=[[lookup("a")]], decode_s=0.2))
    # The sidecar still ran (drafts), but the tool only ran once, after the commit.
    assert pool.calls == [("lookup", {"key": "a"}, False)]
    [result] = out["ooo_spec"]["tool_results"]
    assert result["speculative"] is False and result["saved_ms"] == 0
    # The same request with pre-execution on starts the tool from the prediction (the commit
    # waits until it did).
    pool = FakePool(lookup_s=0.05)
    out = await complete(ChatService("m", True, pool), request(execute_tools=True, max_steps=1),
                         Script(finals, predictions=[[lookup("a")]], decode_s=0.2,
                                commit_after=pool.speculated))
    assert pool.calls == [("lookup", {"key": "a"}, True)]
    assert out["ooo_spec"]["tool_results"][0]["speculative"] is True


async def test_first_commit_is_the_first_turns_commit_not_the_end() -> None:
    clock = ManualClock()  # time moves only as the fakes spend it
    pool = FakePool(lookup_s=0.3, clock=clock)
    finals = [final([lookup("a")]), final([], content="done")]
    out = await complete(ChatService("m", False, pool, clock=clock),
                         request(execute_tools=True, max_steps=1, enabled=False),
                         Script(finals, decode_s=0.1, clock=clock))
    timings = out["ooo_spec"]["timings_ms"]
    # Turn 1 commits after 0.1 s; then the tool (0.3 s) and turn 2 (0.1 s) follow.
    assert timings["first_commit"] == pytest.approx(100)
    assert timings["total"] == pytest.approx(500)
