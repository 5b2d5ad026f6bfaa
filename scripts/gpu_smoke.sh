#!/usr/bin/env bash
# GPU smoke test: what an operator runs once on ONE GPU host with the cluster image, before the
# cluster. Starts configs/gpu-smoke-1gpu.yaml (the GPU config's models, both on this GPU: an
# H100 80GB as shipped; for another GPU edit its gpu_type values and let the check say what to
# shrink), sends a few BFCL cases with speculation off and on, and prints per case the main
# model's passes per call, tokens per pass and whether the output is identical to plain.
# Exit 0 = every request answered and speculation drafted.
#
# The image carries the app, not the configs or load_tests: run it from a checkout of the same
# commit, mounted into the image:
#   docker run --rm --gpus 1 --shm-size 8g -v "$PWD:/home/ray/src" -w /home/ray/src \
#     registry.example.com/ooo-spec:0.1.0-gpu scripts/gpu_smoke.sh
# The BFCL cases come from the bfcl-eval wheel: fetched with pip on first use, or put it in
# $OOO_SPEC_HOME/datasets (default ~/.cache/ooo-spec/datasets) beforehand on a host offline.
# Arguments go to `python -m load_tests.gpu_smoke` (--limit N cases per category, --config,
# --base-url URL to test a running server instead).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Models come from the image's Hugging Face cache, as on the cluster. With the hub offline,
# `config check` below fails at once naming any model that is not in the cache (an image built
# with PREFETCH_MODELS=""), before anything starts.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
CONFIG="configs/gpu-smoke-1gpu.yaml"

if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_smoke: no nvidia-smi: run this on a GPU host, in the image started with --gpus" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -c 'import torch, vllm; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}")'
"$PYTHON" -m app.cli config check "$CONFIG"
exec "$PYTHON" -m load_tests.gpu_smoke --config "$CONFIG" "$@"
