#!/usr/bin/env bash
# scripts/gpu_check_vllm.sh: does the local engine work with the vLLM installed here? For the GPU recipe's
# machine (vLLM 0.26.0, the newest release for its torch 2.11), run from the checkout's root after
# device_setup.sh, in the same step:
#   bash .gpu/scripts/device_setup.sh && bash scripts/gpu_check_vllm.sh
# Also runs on CPU (--cpu: float32, eager), e.g. against the tested default in CI's environment.
# Checks, in order, and exits non-zero at the first failure:
#   1. the compat table (scripts/check_vllm_layout.py) against the installed vllm/ source;
#   2. every moved name imports through local_engine.vllm_compat (a real import of this vLLM);
#   3. batchyard run --model and vLLM's run_batch on the same N-line file (tiny random-weight model from
#      bench/gpu_model.py): every line 200 in both, the same custom_ids, the same completion-token total.
# Settings: N=200 MAX_TOKENS=16 WORK=/tmp/gpu-check (model, file, outputs, logs).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CPU=0; [ "${1:-}" = "--cpu" ] && CPU=1
if [ -f /tmp/gpu-env.sh ]; then
  # shellcheck disable=SC1091
  . /tmp/gpu-env.sh
fi
cd "$ROOT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
N=${N:-200}; MAX_TOKENS=${MAX_TOKENS:-16}; WORK=${WORK:-/tmp/gpu-check}
FLAGS=(); [ "$CPU" = 1 ] && FLAGS=(--dtype float32 --enforce-eager --max-model-len 1024) && export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
mkdir -p "$WORK"
fail() { echo "CHECK FAILED: $*"; exit 1; }

SITE=$(python3 -c "import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))" 2>/dev/null) \
  || fail "vllm does not import here"
echo "== 1. compat table against $SITE"
python3 scripts/check_vllm_layout.py "$SITE" || fail "the compat table does not match this vLLM"

echo "== 2. every moved name through local_engine.vllm_compat"
python3 - <<'PY' || fail "a moved name does not import"
import vllm
from local_engine import vllm_compat
for name in vllm_compat.HOMES:
    vllm_compat.load(name)
print(f"vllm {vllm.__version__}: {len(vllm_compat.HOMES)} moved names import; "
      f"propagate_flash_late_interaction: {'yes' if vllm_compat.optional('propagate_flash_late_interaction') else 'absent'}")
PY

echo "== 3. batchyard run --model and run_batch on $N lines"
M=$WORK/model-tiny; B=$WORK/batch-$N.jsonl
python3 bench/gpu_model.py --model "$M" --size tiny --batch "$B" -n "$N" --max-tokens "$MAX_TOKENS" || fail "model builder"
python3 -m gateway.cli run -i "$B" -o "$WORK/batchyard.jsonl" --model "$M" --no-progress "${FLAGS[@]}" \
  > "$WORK/batchyard.log" 2>&1 || { tail -20 "$WORK/batchyard.log"; fail "batchyard run"; }
grep -E "requests in|engines ready" "$WORK/batchyard.log"
python3 -m vllm.entrypoints.openai.run_batch -i "$B" -o "$WORK/run_batch.jsonl" --model "$M" "${FLAGS[@]}" \
  > "$WORK/run_batch.log" 2>&1 || { tail -20 "$WORK/run_batch.log"; fail "run_batch"; }
python3 - "$WORK/batchyard.jsonl" "$WORK/run_batch.jsonl" "$N" <<'PY' || fail "outputs differ"
import json, sys
def read(path):
    rows = [json.loads(x) for x in open(path) if x.strip()]
    ok = {r["custom_id"] for r in rows if (r.get("response") or {}).get("status_code") == 200}
    tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in rows if r["custom_id"] in ok)
    return {r["custom_id"] for r in rows}, ok, tokens
ours, theirs, n = read(sys.argv[1]), read(sys.argv[2]), int(sys.argv[3])
print(f"batchyard: {len(ours[1])}/{len(ours[0])} ok, {ours[2]} completion tokens; "
      f"run_batch: {len(theirs[1])}/{len(theirs[0])} ok, {theirs[2]} completion tokens")
assert len(ours[0]) == n and ours[0] == theirs[0], "different custom_ids"
assert ours[1] == ours[0] and theirs[1] == theirs[0], "a line did not succeed"
assert ours[2] == theirs[2], "different completion-token totals"
PY
echo "== all checks passed"
