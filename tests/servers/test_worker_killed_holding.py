"""A worker SIGKILLed while its batch holds a reservation (`budget_reservation: estimate`), on each store (SQLite:
`serve --workers 2`, both killed; Redis, one server and a 3-master cluster: `serve` and a worker, the worker
killed and another started): the batch completes elsewhere, the hold is gone once it ends (a crash leaks none),
the spend is the cost of the results journaled, each once, and each key reads the report it may
(`GET /v1/spend`: the team's own key, the master key; another team's key gets 404)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway, submit
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer, start_worker
from tests.support.team_helpers import MODEL, done, finished, lines, start_shared, until

PRICE = 0.001  # USD per token, in and out: the upstream's reply to a line is 3 + 4 tokens, 0.007 USD
LINES = 40
TEAMS: list[dict[str, Any]] = [
    {"team_id": "careful", "api_keys": ["sk-careful"], "max_budget": 5.0, "budget_reservation": "estimate"},
    {"team_id": "other", "api_keys": ["sk-other"]}]
REDIS = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    if not HAVE_REDIS:
        pytest.skip(NO_REDIS_REASON)
    servers = RedisClusterServers(3).start()
    yield servers
    servers.close()


def _config(upstream: Upstream) -> dict[str, Any]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, shard_size=10, max_concurrency=4,
                            master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    return config


def _spend(gw: Gateway, key: str, **params: str) -> httpx.Response:
    return httpx.get(f"{gw.url}/v1/spend", params=params, headers={"authorization": f"Bearer {key}"}, timeout=30)


def _run_kill_and_read(gw: Gateway, kill: Any) -> None:
    batch_lines = [{**line, "body": {**line["body"], "max_tokens": 8}} for line in lines(LINES, "held", sleep_ms=150)]
    batch = submit(gw.client("sk-careful"), batch_lines)
    until(gw, "sk-careful", batch.id, lambda b: done(b) >= 8, timeout=90)
    held = _spend(gw, "sk-careful").json()["total_reserved_usd"]
    assert held > 0  # what is left of the create's hold while the batch runs
    kill()
    end = until(gw, "sk-careful", batch.id, finished, timeout=180)
    assert end.status == "completed" and end.request_counts is not None
    assert (end.request_counts.completed, end.request_counts.failed) == (LINES, 0), end.request_counts

    own = _spend(gw, "sk-careful")
    assert own.status_code == 200, own.text
    body = own.json()
    assert body["total_reserved_usd"] == 0, body  # released once the batch ended: nothing leaked by the kill
    assert [(r["team"], r["route"], r["requests"]) for r in body["data"]] == [("careful", MODEL, LINES)]
    assert body["total_cost_usd"] == pytest.approx(LINES * 7 * PRICE, abs=1e-9)  # each result's cost, once
    by_master = _spend(gw, "sk-admin", team="careful").json()
    assert by_master["data"] == body["data"]
    refused = _spend(gw, "sk-other", team="careful")
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "team"
    assert _spend(gw, "sk-other").json()["data"] == []  # its own: nothing spent


def test_sqlite_workers_killed_while_a_batch_holds_its_estimate(upstream: Upstream, tmp_path: Path) -> None:
    with start_gateway(_config(upstream), tmp_path / "data", workers=2) as gw:
        def kill_workers() -> None:  # both: whichever holds a shard is killed mid-shard
            pids = [w["pid"] for w in gw.http("GET", "/health", key="sk-admin").json()["workers"]]
            assert pids and gw.process.pid not in pids
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

        _run_kill_and_read(gw, kill_workers)
        assert "exited with -9" in gw.log()


@pytest.mark.parametrize("kind", [pytest.param("redis", marks=REDIS), pytest.param("cluster", marks=REDIS)])
def test_redis_worker_killed_while_a_batch_holds_its_estimate(
    kind: str, upstream: Upstream, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    fixture = "redis_server" if kind == "redis" else "cluster"
    server: RedisServer | RedisClusterServers = request.getfixturevalue(fixture)
    server.flush()
    with start_shared(_config(upstream), tmp_path / "data", server.url, with_worker=False) as gw:
        config_path, storage = tmp_path / "shared.config.yaml", str(tmp_path / "data" / "blobs")
        workers = [start_worker(config_path, server.url, storage, claim_idle=1.0).wait_ready(120)]
        try:
            def kill_worker() -> None:  # the one worker killed; another takes its shards over
                workers[0].kill()
                workers.append(start_worker(config_path, server.url, storage, claim_idle=1.0).wait_ready(120))

            _run_kill_and_read(gw, kill_worker)
        finally:
            for worker in workers:
                worker.close()
