"""`ooo-spec sidecar distill --trainer ray`: the training as a real Ray Train job
(`TorchTrainer`, CPU workers, gloo), on a tiny random Llama.

- One worker takes the in-process loop's batches and reports checkpoints to Ray Train's
  storage, and a second run of the same command resumes from the latest one: stopped at 2 steps
  and run again to 4, the adapter is the one the in-process loop gives in 4 steps (to float
  tolerance: the worker's thread count may differ).
- Two workers (gradients all-reduced) train to the end and pass the job's own end check that
  the workers hold the same adapter (`ray_job.replicas_agree`; with the all-reduce left out, it
  fails the job).

The jobs run in a child process on a private local Ray (this module with `-m`), so they never
meet the session app of tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 600  # four small jobs on a loaded 2-core box; idle ~1-2 min


def _settings(steps: int, batch_size: int) -> Any:
    from app.distill.train import TrainSettings

    return TrainSettings(steps=steps, batch_size=batch_size, learning_rate=3e-2, rank=8,
                         alpha=16, seed=0, checkpoint_every=2, layers=2)


def _child(out: Path) -> None:
    """Every run, on a private local Ray; writes the adapters' weights as lists."""
    import ray
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from app.distill.pairs import Pair
    from app.distill.training_run import run_training
    from app.engine.embedded_model import embedded_model_dir

    model = out / "tiny"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True)).save_pretrained(model)
    AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(model)
    pairs = [Pair(case_id=f"c{i}", kind="slot", prompt_ids=[1, 20 + i, 30, 40],
                  target_ids=[50 + i, 60]) for i in range(8)]

    def weights(name: str) -> dict[str, list[float]]:
        found = load_file(str(out / name / "adapter" / "adapter_model.safetensors"))
        return {k: v.flatten().tolist() for k, v in found.items()}

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result: dict[str, Any] = {}
        run_training(str(model), pairs, pairs, out / "local", _settings(4, 2), progress=False)
        run_training(str(model), pairs, pairs, out / "one", _settings(2, 2), progress=False,
                     ray_workers=1)
        result["one_at_2"] = weights("one")
        run_training(str(model), pairs, pairs, out / "one", _settings(4, 2), progress=False,
                     ray_workers=1)
        report = run_training(str(model), pairs, pairs, out / "two", _settings(4, 4),
                              progress=False, ray_workers=2)
        result |= {name: weights(name) for name in ("local", "one", "two")}
        result["report"] = report.model_dump()
        (out / "result.json").write_text(json.dumps(result))
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("distill_ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_distill_ray", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 0 and (out / "result.json").exists(), (
        f"the jobs failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def _close(a: dict[str, list[float]], b: dict[str, list[float]], tol: float = 1e-5) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all(abs(x - y) <= tol for x, y in zip(a[k], b[k], strict=True))
        for k in a)


def test_one_worker_trains_the_in_process_loops_adapter_and_a_rerun_resumes(
    runs: dict[str, Any]
) -> None:
    assert not _close(runs["one_at_2"], runs["one"])  # the rerun trained on, from step 2 ...
    assert _close(runs["one"], runs["local"])  # ... to where the in-process loop gets in 4
    assert any(abs(x) > 1e-4 for v in runs["one"].values() for x in v), "nothing was trained"


def test_two_workers_train_to_the_end_holding_the_same_adapter(runs: dict[str, Any]) -> None:
    # The job's end check (replicas_agree) passed, or run_training would have raised.
    assert runs["report"]["steps"] == 4 and runs["report"]["after"]["pairs"] == 8
    assert any(abs(x) > 1e-4 for v in runs["two"].values() for x in v), "nothing was trained"


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
