"""What no Kubernetes schema says about charts/batchyard's rendered manifests (scripts/chart_check.sh).

For each file of `helm template` output given:
- every batchyard container's args parse with batchyard's own CLI (gateway.cli.build_parser), and the
  ConfigMap's team.yaml is a config batchyard loads (gateway.config.parse_config);
- local-model workers ask for GPUs, with a node selector and tolerations;
- the API pods are probed on /health; scrape annotations name a port the pod has;
- /metrics stays the master key's (the config keeps batch_settings.metrics.require_auth);
- a bundled Redis keeps its data on a PersistentVolumeClaim of the release, one pod at a time (Recreate);
- every PodDisruptionBudget and ScaledObject targets a Deployment of the release;
- a KEDA ScaledObject (kubernetes-validate has no schema for KEDA's CRD) has the fields KEDA's
  prometheus scaler reads, its query sums the queue depth batchyard exports (gateway.metrics) over
  exactly the routes its workers serve, and its Deployment leaves `replicas` to the autoscaler.

    python scripts/chart_check.py rendered.yaml...
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

import yaml

from gateway import metrics
from gateway.cli.main import build_parser
from gateway.config.routes import RouteKind
from gateway.config.schema import parse_config


def _depth_metric() -> str:
    """The name batchyard exports the queue depth under, read from what it renders."""
    body, _ = metrics.render(metrics.SharedState(queue_depth={"route": 1}), None)
    (name,) = {line.split("{")[0] for line in body.decode().splitlines() if 'route="route"' in line}
    return name


DEPTH_METRIC = _depth_metric()
QUERY = re.compile(r"sum\(max by \(route\) \((\w+)\{route=~`([^`]+)`\}\)\)")


def fail(where: str, message: str) -> NoReturn:
    raise SystemExit(f"chart_check.py: {where}: {message}")


def config_of(docs: list[dict[str, Any]], where: str) -> Any:
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "team.yaml" in d.get("data", {})]
    if len(maps) != 1:
        fail(where, f"{len(maps)} ConfigMaps with team.yaml, want 1")
    raw = yaml.safe_load(maps[0]["data"]["team.yaml"])
    # os.environ/NAME values come from the keys Secret at run time; any value parses here.
    for entry in raw.get("model_list", []):
        for value in entry.get("litellm_params", {}).values():
            if isinstance(value, str) and value.startswith("os.environ/"):
                os.environ.setdefault(value.removeprefix("os.environ/"), "x")
    os.environ.setdefault("BATCHYARD_MASTER_KEY", "x")
    return parse_config(raw, f"{where}: ConfigMap team.yaml")


def check_container(where: str, container: dict[str, Any]) -> list[str]:
    """The parsed args of a batchyard container; fails unless the CLI takes them as they are."""
    args = list(container["args"])
    try:
        parsed, extra = build_parser().parse_known_args(args)
    except SystemExit:
        fail(where, f"batchyard refuses the args {args}")
    if extra:
        fail(where, f"flags batchyard does not know: {extra}")
    if not any(e["name"] == "BATCHYARD_REDIS_URL" for e in container.get("env", [])):
        fail(where, "no BATCHYARD_REDIS_URL env var: the Redis URL serve and worker read")
    return [parsed.command, *(parsed.models.split(",") if getattr(parsed, "models", None) else [])]


def check_redis(where: str, dep: dict[str, Any], claims: set[str]) -> None:
    """The bundled Redis's /data is a claim the release makes (it outlives a rescheduled pod), mounted by
    one pod at a time."""
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    claim = volumes.get("data", {}).get("persistentVolumeClaim", {}).get("claimName")
    if claim is None:
        fail(where, "the bundled Redis keeps its data in an emptyDir: lost when the pod moves "
             "(redis.bundled.persistence.enabled)")
    if claim not in claims:
        fail(where, f"claims {claim!r}, not a PersistentVolumeClaim of the release ({sorted(claims)})")
    if dep["spec"].get("strategy", {}).get("type") != "Recreate":
        fail(where, "a rolling update would start a second Redis on the same ReadWriteOnce volume: Recreate")


def check_file(path: str) -> int:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    config = config_of(docs, path)
    local = sorted(r.model_name for r in config.routes.values() if r.kind is RouteKind.LOCAL)
    upstream = sorted(r.model_name for r in config.routes.values() if r.kind is not RouteKind.LOCAL)
    if config.batch.metrics.enabled and not config.batch.metrics.require_auth:
        fail(f"{path}: ConfigMap team.yaml", "batch_settings.metrics.require_auth is false: /metrics is open to "
             "anyone who reaches a pod (scrape with the master key instead)")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    serves: dict[str, list[str]] = {}  # Deployment -> routes its workers run shards for
    for name, dep in deployments.items():
        pod = dep["spec"]["template"]
        container = pod["spec"]["containers"][0]
        where = f"{path}: Deployment {name}"
        if container["name"] == "redis":
            check_redis(where, dep, claims)
            continue
        command, *models = check_container(where, container)
        ports = {p["containerPort"] for p in container.get("ports", [])}
        notes = pod["metadata"].get("annotations", {})
        if notes.get("prometheus.io/scrape") == "true" and int(notes["prometheus.io/port"]) not in ports:
            fail(where, f"scrape port {notes['prometheus.io/port']} is not a port of the pod {sorted(ports)}")
        if command == "serve":
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if container.get(probe, {}).get("httpGet", {}).get("path") != "/health":
                    fail(where, f"{probe} is not on /health")
        elif models:
            unknown = set(models) - set(local)
            if unknown:
                fail(where, f"--models {sorted(unknown)}: not local routes of the config ({local})")
            if "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {}):
                fail(where, "a local-model worker without an nvidia.com/gpu limit")
            if not pod["spec"].get("nodeSelector") or not pod["spec"].get("tolerations"):
                fail(where, "a local-model worker without a nodeSelector and tolerations")
            serves[name] = sorted(models)
        else:
            if "--upstream-only" not in container["args"]:
                fail(where, "an upstream worker without --upstream-only")
            serves[name] = upstream
    pod_labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        wanted = pdb["spec"]["selector"]["matchLabels"]
        if not any(wanted.items() <= labels.items() for labels in pod_labels.values()):
            fail(f"{path}: PodDisruptionBudget {pdb['metadata']['name']}", f"selects no pod: {wanted}")
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    for obj in scaled:
        where = f"{path}: ScaledObject {obj['metadata']['name']}"
        if obj["apiVersion"] != "keda.sh/v1alpha1":
            fail(where, f"apiVersion {obj['apiVersion']}")
        spec = obj["spec"]
        target = spec["scaleTargetRef"]["name"]
        if target not in serves:
            fail(where, f"targets {target}, not a worker Deployment ({sorted(serves)})")
        if "replicas" in deployments[target]["spec"]:
            fail(where, f"{target} sets replicas: the autoscaler and `helm upgrade` would fight")
        if not 0 <= int(spec["minReplicaCount"]) <= int(spec["maxReplicaCount"]):
            fail(where, f"replica counts {spec['minReplicaCount']}..{spec['maxReplicaCount']}")
        (trigger,) = spec["triggers"]
        meta = trigger["metadata"]
        if trigger["type"] != "prometheus" or not meta.get("serverAddress"):
            fail(where, f"not a prometheus trigger with a serverAddress: {trigger}")
        for key in ("threshold", "activationThreshold"):
            if not str(meta.get(key, "")).isdigit():
                fail(where, f"{key} {meta.get(key)!r} is not a count")
        if meta.get("ignoreNullValues") != "false":
            fail(where, "an empty answer (the API down) would read as an empty queue: ignoreNullValues must be false")
        m = QUERY.fullmatch(meta["query"])
        if not m or m.group(1) != DEPTH_METRIC:
            fail(where, f"query {meta['query']!r} is not the pool's sum of {DEPTH_METRIC}")
        # Prometheus anchors label regexes; RE2 and Python agree on what regexQuoteMeta writes.
        matched = sorted(r for r in config.routes if re.fullmatch(m.group(2), r))
        if matched != serves[target]:
            fail(where, f"the query's routes {matched} are not those {target} serves {serves[target]}")
    print(f"chart_check.py: {path}: {len(deployments)} Deployments, {len(scaled)} ScaledObjects: ok")
    return 0


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        check_file(arg)
