#!/usr/bin/env bash
# The README's main job, offline on the CPU: run examples/demo_batch.jsonl through the tiny local
# engine with config/local-tiny.yaml and show the first lines of the merged output.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh --engine
VENV="${BATCHYARD_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"

export BATCHYARD_TINY_MODELS="$ROOT/.batchyard/models"
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export LITELLM_LOCAL_MODEL_COST_MAP=True

python -m local_engine.tiny_model "$BATCHYARD_TINY_MODELS"

batchyard run -i examples/demo_batch.jsonl -o results.jsonl --config config/local-tiny.yaml
echo "demo: $(wc -l < results.jsonl) result lines in results.jsonl; the first ones:"
head -n 3 results.jsonl
# `batchyard` lives in the venv: a new shell finds it once the venv is activated (docs/getting-started.md).
ACTIVATE="$VENV/bin/activate"
[[ "$VENV" == "$ROOT/.venv" ]] && ACTIVATE=".venv/bin/activate"
echo
echo "demo: next, serve the same models over OpenAI's Batch API (docs/getting-started.md):"
echo "  source $ACTIVATE"
echo "  batchyard serve --config config/local-tiny.yaml"
