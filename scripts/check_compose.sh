#!/usr/bin/env bash
# Validate docker/compose.yaml (all profiles) without a Docker engine: `docker compose config`.
# Falls back to the standalone docker-compose; skips (exit 0) with a message when neither exists.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FILE=docker/compose.yaml

if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    COMPOSE=(docker-compose)
else
    echo "check_compose: skipped: neither 'docker compose' nor 'docker-compose' is installed"
    exit 0
fi

# Default services, then with the optional s3 profile (minio) and traces profile (jaeger).
"${COMPOSE[@]}" -f "$FILE" config -q
"${COMPOSE[@]}" -f "$FILE" --profile s3 config -q
"${COMPOSE[@]}" -f "$FILE" --profile traces config -q
"${COMPOSE[@]}" -f "$FILE" --profile s3 config --services | sort | tr '\n' ' '
echo
echo "check_compose: $FILE is valid (${COMPOSE[*]})"
