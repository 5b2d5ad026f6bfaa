"""`VllmEngine.start` builds the engine on the step-loop thread (on CUDA the current stream and
device are per thread, and CUDA graphs are captured during the build) and raises a build error
on the caller's thread. vLLM's build is replaced by a stand-in: this is about threads."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import EngineConfig
from app.engine.vllm_engine import VllmEngine


class FakeEngineCore:
    def __init__(self) -> None:
        self.shut_down_on: list[str] = []

    def shutdown(self) -> None:
        self.shut_down_on.append(threading.current_thread().name)


class FakeLLMEngine:
    def __init__(self) -> None:
        self.stepped_on: set[str] = set()
        self.stepped = threading.Event()  # set once the step loop has looked at the engine
        self.engine_core = FakeEngineCore()

    def has_unfinished_requests(self) -> bool:
        self.stepped_on.add(threading.current_thread().name)
        self.stepped.set()
        return False


@pytest.fixture(autouse=True)
def keep_environ() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def engine(tmp_path: Any) -> VllmEngine:
    return VllmEngine(EngineConfig(model=str(tmp_path)))


def test_build_and_steps_happen_on_the_same_thread(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_on: list[str] = []
    fake = FakeLLMEngine()

    def build(self: VllmEngine) -> None:
        built_on.append(threading.current_thread().name)
        self.engine = fake

    monkeypatch.setattr(VllmEngine, "_build", build)
    e = engine(tmp_path)
    e.start()
    try:
        assert built_on == ["vllm-step-loop"]
        assert built_on[0] != threading.current_thread().name
        assert e.healthy
        # The engine's environment was set before the build (read by vLLM at import).
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
        assert e.launch is not None and e.launch.platform == "cpu"
        assert fake.stepped.wait(60)  # a bound on waiting only: the step loop looked
        assert fake.stepped_on == {"vllm-step-loop"}
    finally:
        e.stop()
    # Shut down at once, after the step loop ended: left to the garbage collector, vLLM's
    # teardown would reset the process-wide parallel groups under the next engine.
    assert fake.engine_core.shut_down_on == [threading.current_thread().name]
    assert e.engine is None and not e.healthy


def test_a_build_error_is_raised_by_start(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def build(self: VllmEngine) -> None:
        raise ValueError("KV cache too small")

    monkeypatch.setattr(VllmEngine, "_build", build)
    e = engine(tmp_path)
    with pytest.raises(ValueError, match="KV cache too small"):
        e.start()
    assert not e.healthy
    assert e._thread is not None and not e._thread.is_alive()
