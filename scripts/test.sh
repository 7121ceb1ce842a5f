#!/usr/bin/env bash
# The project's test command: venv with the CPU engine, redis-server and valkey-server binaries, the tiny models,
# then ruff, mypy, the docs build (mkdocs --strict) and pytest: on 2 workers, each test file on one of them
# (pytest-xdist, --dist loadfile: a file's module fixtures and servers stay in one process). Arguments go to pytest, e.g.
# `bash scripts/test.sh -k batches -x`.
# Exits non-zero on the first failing step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/lock.sh --check      # hashes present, litellm==1.110.2, no forbidden release
bash scripts/setup.sh --engine
VENV="${BATCHYARD_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"

# Tests start their own redis-server on a free loopback port; they only need the binary. The compose
# file is validated with docker-compose (no Docker engine runs here; `config` needs none). The dashboard
# test drives Debian's chromium with Playwright (its own browser download cannot work offline).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)  # the cluster tests: redis-cli --cluster create
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
if ! command -v docker-compose >/dev/null 2>&1 && ! { command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; }; then
    missing+=(docker-compose)
fi
if ((${#missing[@]})); then
    echo "test: installing ${missing[*]} (apt-get)"
    SUDO=""
    if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Redis suites run on Valkey too (tests/conftest.py's server_binary and any_redis; with CI=true a missing
# valkey-server fails them). Bookworm has it only in bookworm-backports (valkey-server 8.0.1): that source is
# added (backports are never picked unless asked, so nothing else changes) and only valkey is taken from it.
# Its package would start a valkey service on port 6379; a policy-rc.d that denies (exit 101) stops that,
# put there for the install only, where the image has none of its own.
if ! command -v valkey-server >/dev/null 2>&1 && grep -qx 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
    echo "test: installing valkey-server (apt-get, bookworm-backports)"
    SUDO=""
    if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
    BACKPORTS=/etc/apt/sources.list.d/bookworm-backports.list
    if ! grep -rqsw --include='*.list' --include='*.sources' 'bookworm-backports' /etc/apt/sources.list \
            /etc/apt/sources.list.d/; then
        echo 'deb http://deb.debian.org/debian bookworm-backports main' | $SUDO tee "$BACKPORTS" >/dev/null
    fi
    NO_START=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        NO_START=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$NO_START" >/dev/null
        $SUDO chmod 755 "$NO_START"
    fi
    status=0
    $SUDO apt-get update -qq || status=$?
    if ((status == 0)); then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            -t bookworm-backports valkey-server >/dev/null || status=$?
    fi
    if [[ -n "$NO_START" ]]; then $SUDO rm -f "$NO_START"; fi
    if ((status != 0)); then exit "$status"; fi
fi
bash scripts/check_compose.sh      # docker/compose.yaml is valid

# The openai SDK's 2.x line, beside the venv's 3.x, for tests/servers/test_openai2_client.py (which puts it first
# on PYTHONPATH in a client subprocess). Hash-locked, without dependencies: the venv's serve it.
export BATCHYARD_OPENAI2="$ROOT/.batchyard/openai2"
if [[ "$(cat "$BATCHYARD_OPENAI2/.lock" 2>/dev/null)" != "$(sha256sum requirements/openai2.lock | cut -d' ' -f1)" ]]; then
    rm -rf "$BATCHYARD_OPENAI2"
    python -m pip install -q --disable-pip-version-check --require-hashes --no-deps --target "$BATCHYARD_OPENAI2" \
        -r requirements/openai2.lock 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    sha256sum requirements/openai2.lock | cut -d' ' -f1 > "$BATCHYARD_OPENAI2/.lock"
fi

export BATCHYARD_TINY_MODELS="$ROOT/.batchyard/models"
export VLLM_CPU_KVCACHE_SPACE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
# Two pytest workers start engines side by side: bound the way one `batchyard run` binds its engine (every
# engine core on the same core), they would queue behind each other. tests/engine/test_engine_cpu_threads.py binds.
export VLLM_CPU_OMP_THREADS_BIND=nobind
export LITELLM_LOCAL_MODEL_COST_MAP=True

echo "test: building tiny models in $BATCHYARD_TINY_MODELS"
python -m local_engine.tiny_model "$BATCHYARD_TINY_MODELS"

echo "test: ruff"
ruff check gateway providers local_engine tests bench
echo "test: mypy"
mypy
# The docs site ([docs] extra, in core.lock): --strict fails on a dead link or anchor; built into a temp dir.
echo "test: docs (mkdocs build --strict)"
DOCS_SITE="$(mktemp -d)"
trap 'rm -rf "$DOCS_SITE"' EXIT
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$DOCS_SITE"
echo "test: pytest"
python -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
