#!/usr/bin/env bash
# bench/gpu_engine.sh: the GPU benchmark (bench/gpu_engine.py) on a machine set up by the GPU recipe.
#   bash bench/gpu_engine.sh                       # 1.1B model, 5,000 requests, llm + batchyard + runbatch
#   bash bench/gpu_engine.sh --size tiny -n 500    # a one-minute check of the pipeline
#   bash bench/gpu_engine.sh --engine-args "--max-num-seqs 1024 --max-num-batched-tokens 16384"
# Where the recipe's device_setup.sh ran (vLLM installed into /tmp/site), its environment is loaded first
# (/tmp/gpu-env.sh: PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER=0, offline hub). Anywhere else vLLM is used as
# installed. Every flag goes to bench/gpu_engine.py (--help lists them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -f /tmp/gpu-env.sh ]; then
  # shellcheck disable=SC1091
  . /tmp/gpu-env.sh
fi
cd "$ROOT"
exec python3 bench/gpu_engine.py "$@"
