"""`/metrics`, scraped from real server processes and parsed with prometheus-client's parser.

- During a batch (loopback upstream with latency): the batch is in progress, requests are
  in flight, shards wait in the queue. After it: requests by status, tokens and the latency
  histogram's count equal the batch's own numbers.
- The master key is needed (401 without a key, 403 for a team's key); `enabled: false` turns
  the route off, `require_auth: false` opens it.
- Shared mode with two `batchyard worker` processes sharing PROMETHEUS_MULTIPROC_DIR with the
  API process: the API's totals equal the batch's, though the workers did the work; a worker's
  own `--metrics-port` answers too; a stopped worker's live gauges go, its counts stay.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from gateway import metrics
from gateway.config.schema import parse_config
from gateway.domain import Result
from gateway.errors import ConfigError
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import FINISHED, chat_line, gateway_config, start_gateway, submit, wait_batch
from tests.support.services import (
    HAVE_REDIS,
    NO_REDIS_REASON,
    REPO_ROOT,
    RedisServer,
    WorkerProcess,
    free_port,
    process_env,
    shared_config,
    write_config,
)

MASTER, ALPHA = "sk-master-metrics-0123", "sk-alpha-metrics-0123"
MODEL = "gpt-mini"
Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(latency_ms=150) as server:  # slow enough that a scrape sees the batch running
        yield server


def _config(upstream: Upstream, **batch: Any) -> dict[str, Any]:
    return gateway_config(upstream, master_key=MASTER, teams=[{"team_id": "alpha", "api_keys": [ALPHA]}],
                          models=(MODEL,), **batch)


def _lines(n: int, failing: int) -> list[dict[str, Any]]:
    return [chat_line(f"r{i}", MODEL, f"#fail:400 line {i}" if i < failing else f"hello number {i}")
            for i in range(n)]


def parse(text: str) -> Samples:
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


def names(samples: Samples) -> set[str]:
    return {n for n, _, _ in samples}


def scrape(url: str, key: str | None = MASTER) -> Samples:
    reply = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(reply.text)


def _assert_error(reply: httpx.Response, status: int) -> None:
    assert reply.status_code == status, reply.text
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def _assert_totals(samples: Samples, batch: Any, n: int, failing: int) -> None:
    assert value(samples, "batchyard_requests_total", team="alpha", route=MODEL) == n
    assert value(samples, "batchyard_requests_total", team="alpha", route=MODEL, status="200") == n - failing
    assert value(samples, "batchyard_requests_total", team="alpha", route=MODEL, status="400") == failing
    assert batch.usage is not None and batch.usage.input_tokens > 0
    assert value(samples, "batchyard_tokens_total", team="alpha", route=MODEL, type="input") == \
        batch.usage.input_tokens
    assert value(samples, "batchyard_tokens_total", team="alpha", route=MODEL, type="output") == \
        batch.usage.output_tokens
    assert value(samples, "batchyard_request_duration_seconds_count", route=MODEL) == n  # one call per line
    assert value(samples, "batchyard_request_duration_seconds_bucket", route=MODEL, le="+Inf") == n
    assert value(samples, "batchyard_request_duration_seconds_sum", route=MODEL) > 0
    assert value(samples, "batchyard_requests_in_flight", route=MODEL) == 0


def test_scrape_during_and_after_a_batch(upstream: Upstream, tmp_path: Path) -> None:
    n, failing = 24, 3
    config = _config(upstream, shard_size=4, max_concurrency=2, max_shards_in_flight=1)
    with start_gateway(config, tmp_path / "data") as gw:
        before = scrape(gw.url)
        assert {"batchyard_queue_depth", "batchyard_batches"} <= names(before)
        assert value(before, "batchyard_queue_depth", route=MODEL) == 0
        assert value(before, "batchyard_requests_total") == 0

        client = gw.client(ALPHA)
        created = submit(client, _lines(n, failing))
        running: list[Samples] = []
        while client.batches.retrieve(created.id).status not in FINISHED:
            samples = scrape(gw.url)
            if value(samples, "batchyard_batches", status="in_progress") == 1:
                running.append(samples)
            time.sleep(0.05)
        assert running, "no scrape saw the batch in progress"
        assert any(value(s, "batchyard_requests_in_flight", route=MODEL) >= 1 for s in running)
        assert any(value(s, "batchyard_queue_depth", route=MODEL) >= 1 for s in running)  # shards waiting
        assert all(value(s, "batchyard_requests_total", team="alpha") <= n for s in running)

        batch = wait_batch(client, created.id)
        assert batch.status == "completed" and batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (n - failing, failing)
        after = scrape(gw.url)
        _assert_totals(after, batch, n, failing)
        assert value(after, "batchyard_batches") == 0  # none active any more
        assert value(after, "batchyard_queue_depth") == 0

        _assert_error(httpx.get(gw.url + "/metrics", timeout=10), 401)
        _assert_error(httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer sk-wrong"}, timeout=10), 401)
        _assert_error(httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {ALPHA}"}, timeout=10), 403)
        log = gw.log()
    assert MASTER not in log and ALPHA not in log


def test_settings_turn_it_off_or_open_it(upstream: Upstream, tmp_path: Path) -> None:
    with start_gateway(_config(upstream, metrics={"enabled": False}), tmp_path / "off") as gw:
        _assert_error(gw.http("GET", "/metrics", MASTER), 404)
        assert gw.http("GET", "/v1/models", MASTER).status_code == 200
    with start_gateway(_config(upstream, metrics={"require_auth": False}), tmp_path / "open") as gw:
        samples = scrape(gw.url, key=None)
        assert "batchyard_batches" in names(samples)


def test_results_counted_by_team_route_status_and_cost() -> None:
    ok = Result(line=1, custom_id="a", status_code=200, model=MODEL, cost_usd=0.25,
                body={"usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    refused = Result(line=2, custom_id="b", status_code=429, model=MODEL, body={"error": {"message": "slow"}})
    never = Result.failure(3, "c", "batch_cancelled", "cancelled", model=MODEL)
    unknown = Result.failure(4, "d", "model_not_found", "no such model", model="who")
    metrics.observe_results("unit-team", MODEL, [ok, refused, never])
    metrics.observe_results("unit-team", "", [unknown])
    body, content_type = metrics.render(metrics.SharedState(queue_depth={MODEL: 2}, batches={"in_progress": 1}), None)
    assert content_type.startswith("text/plain")
    samples = parse(body.decode())
    team = {"team": "unit-team"}
    assert value(samples, "batchyard_requests_total", **team, route=MODEL, status="200") == 1
    assert value(samples, "batchyard_requests_total", **team, route=MODEL, status="429") == 1
    assert value(samples, "batchyard_requests_total", **team, route=MODEL, status="batch_cancelled") == 1
    assert value(samples, "batchyard_requests_total", **team, route="unrouted", status="model_not_found") == 1
    assert value(samples, "batchyard_tokens_total", **team, route=MODEL, type="input") == 3
    assert value(samples, "batchyard_tokens_total", **team, route=MODEL, type="output") == 5
    assert value(samples, "batchyard_cost_usd_total", **team, route=MODEL) == 0.25
    assert value(samples, "batchyard_queue_depth", route=MODEL) == 2
    assert value(samples, "batchyard_batches", status="in_progress") == 1


# -- shared mode, several processes -----------------------------------------------------------


def _serve(config_path: Path, redis_url: str, storage: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes],
                                                                                          str, Path]:
    port = free_port()
    fd, log = tempfile.mkstemp(prefix="serve-", suffix=".log")
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path), "--port", str(port),
           "--redis-url", redis_url, "--blobs", str(storage), "--claim-idle", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(env), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
    os.close(fd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, Path(log)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"serve did not start:\n{Path(log).read_text(errors='replace')}")
        time.sleep(0.1)


def _worker(config_path: Path, redis_url: str, storage: Path, env: dict[str, str], *extra: str) -> WorkerProcess:
    cmd = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(config_path), "--redis-url", redis_url,
           "--blobs", str(storage), "--claim-idle", "2", *extra]
    fd, log = tempfile.mkstemp(prefix="worker-", suffix=".log")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(env), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
    os.close(fd)
    return WorkerProcess(proc, Path(log))


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_shared_mode_two_workers_one_multiprocess_dir(upstream: Upstream, tmp_path: Path) -> None:
    n, failing = 40, 4
    raw = shared_config(upstream.v1_url, (MODEL,), shard_size=4, max_concurrency=2, max_shards_in_flight=1,
                        teams=[{"team_id": "alpha", "api_keys": [ALPHA]}])
    raw["general_settings"] = {"master_key": MASTER}
    config_path = write_config(tmp_path / "config.yaml", raw)
    prom_dir, storage = tmp_path / "prom", tmp_path / "blobs"
    env = {metrics.MULTIPROC_ENV: str(prom_dir)}
    redis = RedisServer().start()
    api: subprocess.Popen[bytes] | None = None
    workers: list[WorkerProcess] = []
    try:
        api, url, api_log = _serve(config_path, redis.url, storage, env)
        metrics_port = free_port()
        workers = [_worker(config_path, redis.url, storage, env),
                   _worker(config_path, redis.url, storage, env, "--metrics-port", str(metrics_port))]
        for w in workers:
            w.wait_ready()
        client = OpenAI(base_url=url + "/v1", api_key=ALPHA, max_retries=0, timeout=30)
        batch = wait_batch(client, submit(client, _lines(n, failing)).id, timeout=120)
        assert batch.status == "completed"

        totals = scrape(url)
        _assert_totals(totals, batch, n, failing)
        assert value(totals, "batchyard_batches") == 0 and "batchyard_queue_depth" in names(totals)
        pids = [w.process.pid for w in workers]
        for pid in pids:  # both workers executed calls: each wrote its own histogram file
            assert (prom_dir / f"histogram_{pid}.db").exists(), sorted(p.name for p in prom_dir.iterdir())
        assert not (prom_dir / f"histogram_{api.pid}.db").exists()  # the API process ran no shard

        own = f"http://127.0.0.1:{metrics_port}"
        _assert_error(httpx.get(own + "/metrics", timeout=10), 401)
        worker_view = scrape(own)
        assert value(worker_view, "batchyard_requests_total") == n
        assert "batchyard_queue_depth" not in names(worker_view)  # shared state: the API reports it, once

        workers[0].process.send_signal(signal.SIGTERM)
        workers[0].process.wait(30)
        assert workers[0].process.returncode == 0, workers[0].log()
        assert not (prom_dir / f"gauge_livesum_{pids[0]}.db").exists()  # marked dead at exit
        assert value(scrape(url), "batchyard_requests_total", team="alpha") == n  # its counts stay
    finally:
        for w in workers:
            w.close()
        if api is not None:
            api.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                api.wait(20)
            if api.poll() is None:
                api.kill()
        redis.close()


def test_metrics_settings_are_checked() -> None:
    base = {"model_list": [{"model_name": MODEL, "litellm_params": {"model": "openai/gpt-mini"}}]}
    config = parse_config({**base, "batch_settings": {"metrics": {"enabled": False}}}, "team.yaml")
    assert (config.batch.metrics.enabled, config.batch.metrics.require_auth) == (False, True)
    for bad, key in (({"enabled": "yes"}, "batch_settings.metrics.enabled"),
                     ({"port": 9400}, "batch_settings.metrics.port"), ("on", "batch_settings.metrics")):
        with pytest.raises(ConfigError) as info:
            parse_config({**base, "batch_settings": {"metrics": bad}}, "team.yaml")
        assert "team.yaml" in str(info.value) and key in str(info.value)
