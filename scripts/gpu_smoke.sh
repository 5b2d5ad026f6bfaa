#!/usr/bin/env bash
# GPU smoke test: what the project runs the first time it has ONE GPU, and what an operator runs
# once on a GPU host before the cluster. In order, each step timed:
#   1. install (--install): a virtual environment with the project's `gpu` extra (vLLM's CUDA
#      wheel, Ray) and arctic-inference (vLLM's `suffix` method), from the package index; the
#      models then come from the Hugging Face hub (HF_HUB_OFFLINE=0) on first use;
#   2. the node's facts: GPU, memory, driver, compute capability, torch/CUDA/vLLM versions;
#   3. the config: configs/gpu-smoke-1gpu-h200.yaml on a GPU of 140 GB or more (every mode:
#      the ngram and suffix peers are deployed), configs/gpu-smoke-1gpu.yaml below (an H100 80GB:
#      main model and sidecar only; the ngram and suffix modes are skipped and said so), or
#      --config; `ooo-spec config check` on it;
#   4. the app started from it and a few forced-call BFCL cases sent in every mode (plain,
#      ngram, suffix, drafts, ooo), each compared with plain (the bfloat16 identity check);
#   5. one JSON file (--out) with passes, times, acceptance per draft source and the facts.
# What each number means: docs/benchmarks.md, "The GPU smoke run". Exit 0 = every request
# answered and speculation drafted. Budget: 10 minutes with a warm package cache
# (OOO_SPEC_SMOKE_BUDGET_S, seconds; the run stops at it).
#
#   scripts/gpu_smoke.sh --install                  # a bare GPU machine with this checkout
#   scripts/gpu_smoke.sh                            # the image (models in its HF cache):
#   docker run --rm --gpus 1 --shm-size 8g -v "$PWD:/home/ray/src" -w /home/ray/src \
#     registry.example.com/ooo-spec:0.1.0-gpu scripts/gpu_smoke.sh
#   scripts/gpu_smoke.sh --dry-run                  # no GPU: rehearse every step (CI runs it)
#
# --dry-run checks each step's command and inputs without a GPU or a server: the install's
# extra exists, the config passes `config check` (hub not consulted), every case has a request
# in every mode, and the JSON report is written (facts marked as a dry run).
# The BFCL cases come from the bfcl-eval wheel: fetched with pip on first use, or put it in
# $OOO_SPEC_HOME/datasets (default ~/.cache/ooo-spec/datasets) beforehand on a host offline.
# Other arguments go to `python -m load_tests.gpu_smoke` (--limit N cases per category,
# --modes, --base-url URL to test a running server instead).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DRY_RUN=0
INSTALL=0
CONFIG=""
OUT="gpu-smoke-$(date -u +%Y%m%dT%H%M%SZ).json"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --install) INSTALL=1 ;;
    --config) CONFIG="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
BUDGET_S="${OOO_SPEC_SMOKE_BUDGET_S:-600}"
START_S=$(date +%s)
FACTS="$(mktemp)"
trap 'rm -f "$FACTS"' EXIT
say() { echo "gpu_smoke: $*" >&2; }

# ---- 1. install ---------------------------------------------------------------------------
INSTALL_S=0
if [ "$INSTALL" = 1 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    "$PYTHON" - <<'EOF'
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
assert any(d.startswith("vllm==") for d in extras["gpu"]), "no vllm in the gpu extra"
EOF
    say "(dry run) would run: $PYTHON -m venv .venv-gpu && .venv-gpu/bin/pip install -e '.[gpu,dev]' arctic-inference"
  else
    t0=$(date +%s)
    "$PYTHON" -m venv .venv-gpu
    .venv-gpu/bin/pip install -q --upgrade pip
    .venv-gpu/bin/pip install -q -e ".[gpu,dev]" arctic-inference
    PYTHON="$PWD/.venv-gpu/bin/python"
    INSTALL_S=$(( $(date +%s) - t0 ))
    # A bare machine has no model cache: the hub fills it.
    export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-0}"
  fi
fi
# Models come from the image's Hugging Face cache, as on the cluster. With the hub offline,
# `config check` below fails at once naming any model that is not in the cache (an image built
# with PREFETCH_MODELS=""), before anything starts.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

# ---- 2. the node's facts ------------------------------------------------------------------
GPU_LINE=""
if command -v nvidia-smi >/dev/null; then
  GPU_LINE="$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
    --format=csv,noheader | head -n 1)"
  echo "$GPU_LINE"
elif [ "$DRY_RUN" = 0 ]; then
  say "no nvidia-smi: run this on a GPU host, in the image started with --gpus (or --dry-run)"
  exit 2
fi
GPU_LINE="$GPU_LINE" DRY_RUN="$DRY_RUN" INSTALL_S="$INSTALL_S" "$PYTHON" - "$FACTS" <<'EOF'
import json, os, sys
fields = [f.strip() for f in os.environ["GPU_LINE"].split(",")] if os.environ["GPU_LINE"] else []
names = ["gpu", "memory_total", "driver", "compute_capability"]
facts = dict(zip(names, fields))
facts["dry_run"] = os.environ["DRY_RUN"] == "1"
facts["install_s"] = int(os.environ["INSTALL_S"])
try:
    import torch
    facts["torch"], facts["torch_cuda"] = torch.__version__, torch.version.cuda
    if facts.get("driver") and torch.version.cuda:
        from app.engine.cuda_driver import driver_check
        verdict = driver_check(torch.version.cuda, facts["driver"])
        facts["driver_check"] = ("refused" if verdict.refusal else
                                 "warning" if verdict.warning else "ok")
except ImportError:
    facts["torch"] = None
try:
    import vllm
    facts["vllm"] = vllm.__version__
except ImportError:
    facts["vllm"] = None
json.dump(facts, open(sys.argv[1], "w"))
print(f"torch {facts['torch']} (CUDA {facts.get('torch_cuda')}), vllm {facts['vllm']}")
EOF

# ---- 3. the config ------------------------------------------------------------------------
if [ -z "$CONFIG" ]; then
  MIB="$(echo "$GPU_LINE" | cut -d, -f2 | tr -dc '0-9')"
  if [ "$DRY_RUN" = 1 ] || [ "${MIB:-0}" -ge 140000 ]; then
    CONFIG="configs/gpu-smoke-1gpu-h200.yaml"
  else
    CONFIG="configs/gpu-smoke-1gpu.yaml"
  fi
fi
say "config $CONFIG"
if [ "$DRY_RUN" = 1 ]; then
  # The real run reads the models from the cache or the hub; the rehearsal checks the rest.
  HF_HUB_OFFLINE=0 "$PYTHON" -m app.cli config check "$CONFIG"
else
  "$PYTHON" -m app.cli config check "$CONFIG"
fi

# ---- 4, 5. the app, every mode, the report ------------------------------------------------
LEFT=$(( BUDGET_S - ($(date +%s) - START_S) ))
[ "$LEFT" -gt 60 ] || LEFT=60
RUN=("$PYTHON" -m load_tests.gpu_smoke --config "$CONFIG" --facts "$FACTS" --json "$OUT")
[ "$DRY_RUN" = 1 ] && RUN+=(--dry-run)
timeout "$LEFT" "${RUN[@]}" ${ARGS[@]+"${ARGS[@]}"}
