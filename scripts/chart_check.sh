#!/usr/bin/env bash
# The Helm chart and the Dockerfiles, checked offline (.ci/run runs it after the tests):
#   hadolint on docker/Dockerfile and docker/Dockerfile.gpu (.hadolint.yaml);
#   helm lint --strict on charts/batchyard, with its default values and with ci/gpu-values.yaml;
#   helm template with each, validated by kubernetes-validate --strict against Kubernetes 1.35 and 1.37;
#   scripts/chart_check.py on the rendered manifests: what no schema says (every batchyard container's
#   args parse with the real CLI; KEDA's streams and consumer group are the queue's).
# The tools come from requirements/tools.lock (scripts/tools.sh).
#
#   bash scripts/chart_check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOOLS="$(bash scripts/tools.sh)"
PY="${BATCHYARD_VENV:-$ROOT/.venv}/bin/python"
[[ -x "$PY" ]] || PY="$(command -v python)"
CHART=charts/batchyard
KUBERNETES=(1.35.0 1.37.0)
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

echo "chart_check: hadolint $("$TOOLS/hadolint" --version | grep -o '[0-9][0-9.]*' | head -1)"
"$TOOLS/hadolint" docker/Dockerfile docker/Dockerfile.gpu

echo "chart_check: $("$TOOLS/helm" version --short)"
declare -A VALUES=([default]="" [gpu]="$CHART/ci/gpu-values.yaml")
for name in default gpu; do
    args=()
    [[ -n "${VALUES[$name]}" ]] && args=(-f "${VALUES[$name]}")
    "$TOOLS/helm" lint --strict "$CHART" "${args[@]}"
    "$TOOLS/helm" template batchyard "$CHART" --namespace batchyard "${args[@]}" > "$OUT/$name.yaml"
    for version in "${KUBERNETES[@]}"; do
        "$TOOLS/kubernetes-validate" --strict -k "$version" "$OUT/$name.yaml" | tee "$OUT/$name-$version.txt"
        # kubernetes-validate only warns (exit 0) on a kind it has no schema for: only KEDA's may be one.
        if grep '^WARN' "$OUT/$name-$version.txt" | grep -v 'kind ScaledObject with api version keda.sh/v1alpha1'; then
            echo "chart_check: a resource without a schema (above)" >&2
            exit 1
        fi
    done
done
"$PY" scripts/chart_check.py "$OUT/default.yaml" "$OUT/gpu.yaml"
echo "chart_check: ok"
