"""Deployments are safe by default.

- `/health` tells anyone whether the service is up, and nothing more; its details (mode, queue depth per
  route, workers with their hosts and pids) are the master key's, as `/metrics` is.
- The Helm chart keeps `/metrics` behind the master key (no annotation scrape without one), probes
  `/health` without a key, and keeps the bundled Redis's data on a PersistentVolumeClaim (or says
  loudly that it does not); scripts/chart_check.py refuses a rendered chart that does otherwise.
- docker/compose.yaml binds the local S3 stand-in to 127.0.0.1 and says its credentials are local.
- `batchyard run` keeps a presigned URL's query string (its signature) nowhere: not in the data dir,
  the log, or what it prints.

helm may not be installed: the chart is read as YAML and text, and chart_check.py runs on manifests
written here as `helm template` renders them (scripts/chart_check.sh renders the real ones in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.schema import parse_config
from tests.fakes.bucket import Bucket
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import REPO_ROOT, Gateway, gateway_config, start_gateway

CHART = REPO_ROOT / "charts" / "batchyard"
MASTER, TEAM = "sk-master-deploy-0123456789", "sk-team-deploy-0123456789"


# -- /health -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, models=["gpt-mini"], master_key=MASTER,
                            teams=[{"team_id": "team", "api_keys": [TEAM]}])
    with start_gateway(config, tmp_path_factory.mktemp("health") / "data") as gateway:
        yield gateway


@pytest.mark.parametrize("path", ["/health", "/health/readiness", "/health/liveness", "/health/liveliness"])
@pytest.mark.parametrize("key", [None, TEAM, "sk-wrong-key"])
def test_health_without_the_master_key_says_only_that_the_service_is_up(gw: Gateway, path: str,
                                                                         key: str | None) -> None:
    reply = gw.http("GET", path, key=key)
    assert reply.status_code == 200
    assert reply.json() == {"status": "healthy"}
    assert str(gw.process.pid) not in reply.text and "127.0.0.1" not in reply.text


def test_health_with_the_master_key_has_the_details(gw: Gateway) -> None:
    body = gw.http("GET", "/health", key=MASTER).json()
    assert body["status"] == "healthy" and body["mode"] == "embedded"
    assert {"queue_depth", "in_flight", "workers", "unserved_routes"} <= set(body)
    assert all({"host", "pid"} <= set(w) for w in body["workers"])


# -- the Helm chart ------------------------------------------------------------------------------------

def _values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_the_chart_keeps_metrics_behind_the_master_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("BATCHYARD_MASTER_KEY", "sk-master")
    values = _values()
    config = parse_config(values["config"], "charts/batchyard/values.yaml")
    assert config.master_key == "sk-master"
    assert config.batch.metrics.enabled and config.batch.metrics.require_auth
    assert values["metrics"]["annotations"] is False  # an annotation scrape sends no key
    templates = "".join(p.read_text() for p in (CHART / "templates").glob("*"))
    assert "ServiceMonitor" not in templates and "require_auth" not in templates


def test_the_charts_probes_are_on_health_and_send_no_key() -> None:
    api = (CHART / "templates" / "api.yaml").read_text()
    probes = [line for line in api.splitlines() if "httpGet" in line]
    assert len(probes) == 3 and all("path: /health" in p for p in probes)
    assert "httpHeaders" not in api and "Authorization" not in api


def test_the_bundled_redis_keeps_its_data_on_a_claim_by_default() -> None:
    persistence = _values()["redis"]["bundled"]["persistence"]
    assert persistence["enabled"] is True and persistence["size"]
    redis = (CHART / "templates" / "redis.yaml").read_text()
    assert "kind: PersistentVolumeClaim" in redis and "claimName:" in redis and "type: Recreate" in redis
    # the emptyDir is only the `else` of persistence, and the install notes shout when it is used
    assert redis.index("persistentVolumeClaim:") < redis.index("{{- else }}") < redis.index("emptyDir: {}")
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "WARNING" in notes and "LOST" in notes and "persistence.enabled" in notes


def _rendered(tmp_path: Path, *, require_auth: bool = True, redis_volume: dict[str, Any] | None = None,
              strategy: str = "Recreate") -> Path:
    """The manifests `helm template` makes of the default values, cut to what chart_check.py reads."""
    config = _values()["config"]
    if not require_auth:
        config["batch_settings"] = {"metrics": {"require_auth": False}}
    volume = redis_volume or {"persistentVolumeClaim": {"claimName": "batchyard-redis-data"}}
    docs = [
        {"kind": "ConfigMap", "metadata": {"name": "batchyard-config"}, "data": {"team.yaml": yaml.safe_dump(config)}},
        {"kind": "PersistentVolumeClaim", "metadata": {"name": "batchyard-redis-data"}},
        {"kind": "Deployment", "metadata": {"name": "batchyard-redis"},
         "spec": {"strategy": {"type": strategy}, "template": {"metadata": {"labels": {"c": "redis"}}, "spec": {
             "containers": [{"name": "redis"}], "volumes": [{"name": "data", **volume}]}}}},
    ]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _chart_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/chart_check.py", str(path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                                       "OPENAI_API_KEY": "x"})


@pytest.mark.parametrize(("case", "kwargs", "complaint"), [
    ("safe", {}, None),
    ("metrics opened", {"require_auth": False}, "require_auth is false"),
    ("redis on an emptyDir", {"redis_volume": {"emptyDir": {}}}, "emptyDir"),
    ("redis on a claim the release lacks", {"redis_volume": {"persistentVolumeClaim": {"claimName": "x"}}},
     "not a PersistentVolumeClaim"),
    ("redis rolled", {"strategy": "RollingUpdate"}, "Recreate"),
])
def test_chart_check_refuses_an_unsafe_rendered_chart(tmp_path: Path, case: str, kwargs: dict[str, Any],
                                                      complaint: str | None) -> None:
    done = _chart_check(_rendered(tmp_path, **kwargs))
    if complaint is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and complaint in done.stderr, (case, done.stderr)


# -- docker/compose.yaml -------------------------------------------------------------------------------

def test_compose_binds_the_s3_stand_in_to_loopback_and_says_its_credentials_are_local() -> None:
    text = (REPO_ROOT / "docker" / "compose.yaml").read_text()
    services = yaml.safe_load(text)["services"]
    (stand_in,) = [name for name, s in services.items() if "minio/minio" in str(s.get("image", ""))]
    ports = services[stand_in]["ports"]
    assert ports and all(str(p).startswith("127.0.0.1:") for p in ports)
    comment = text[:text.index(f"  {stand_in}:")].rsplit("\n\n", 1)[-1]
    assert "local use" in comment and "credentials" in comment
    assert "/health" in str(services["gateway"]["healthcheck"])  # a status code: no key needed


# -- batchyard run and a presigned URL -----------------------------------------------------------------

SIGNATURE = "presigned-secret-signature-4711"


@pytest.fixture()
def bucket() -> Iterator[Bucket]:
    server = Bucket()
    yield server
    server.close()


def test_batchyard_run_stores_no_presigned_urls_query(upstream: Upstream, bucket: Bucket, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_list": [{"model_name": "gpt-mini", "litellm_params": {
        "model": "openai/gpt-mini", "api_key": "sk-upstream", "api_base": upstream.v1_url}}]}))
    lines = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(3)]
    bucket.store["/in.jsonl"] = "".join(json.dumps(x) + "\n" for x in lines).encode()
    data_dir, log = tmp_path / "data", tmp_path / "run.log"
    query = f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature={SIGNATURE}"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", f"{bucket}/in.jsonl{query}",
         "-o", f"{bucket}/out.jsonl{query}", "--config", str(config), "--data-dir", str(data_dir),
         "--log-file", str(log), "--no-progress"],
        cwd=REPO_ROOT, capture_output=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr.decode()
    assert [json.loads(x)["custom_id"] for x in bucket.store["/out.jsonl"].splitlines()] == ["p0", "p1", "p2"]
    kept = {str(p): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}  # the SQLite files too
    assert kept and log.exists()
    kept[str(log)] = log.read_bytes()
    kept["stdout"], kept["stderr"] = done.stdout, done.stderr
    for where, content in kept.items():
        assert SIGNATURE.encode() not in content, f"the signature is in {where}"
        assert b"X-Amz-" not in content, f"the query is in {where}"
