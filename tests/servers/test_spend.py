"""A team's spend is counted with the results it is the cost of (one step of the store), in both modes with real
processes: a worker SIGKILLed mid-batch, its shards run again elsewhere, and the spend is still exactly the cost
of the results the batch recorded (each line once: not less for a result journaled just before the kill, not
more for a line sent twice)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.store.redis.keys import Keys
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway, submit
from tests.support.services import RedisServer, start_worker
from tests.support.team_helpers import MODEL, MODES, done, finished, lines, metric, start_shared, until

PRICE = 0.001  # USD per token, in and out: the upstream's reply to a line is 3 + 4 tokens, 0.007 USD
LINES = 60


def _config(upstream: Upstream) -> dict[str, Any]:
    config = gateway_config(upstream, models=(MODEL,), teams=[{"team_id": "payer", "api_keys": ["sk-payer"]}],
                            shard_size=10, max_concurrency=4, master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    return config


def _run_and_kill(gw: Gateway, kill: Any) -> None:
    """A batch, `kill()` once some results are in; then the batch completes, and its spend is its results'."""
    batch = submit(gw.client("sk-payer"), lines(LINES, "spend", sleep_ms=150))
    until(gw, "sk-payer", batch.id, lambda b: done(b) >= 10)
    kill()
    end = until(gw, "sk-payer", batch.id, finished, timeout=120)
    assert end.status == "completed" and end.request_counts is not None
    assert (end.request_counts.completed, end.request_counts.failed) == (LINES, 0), end.request_counts
    route = gw.client("sk-payer").batches.retrieve(batch.id).model_extra["routes"][MODEL]  # type: ignore[index]
    assert route["cost_usd"] == pytest.approx(LINES * 7 * PRICE)  # the journal's own count
    spend = metric(gw, "batchyard_team_spend_usd", team="payer")
    assert spend == pytest.approx(LINES * 7 * PRICE, abs=1e-9), spend  # each journaled result's cost, once


@pytest.mark.parametrize("mode", MODES)
def test_spend_is_the_cost_of_the_journaled_results_after_a_worker_is_killed(
    mode: str, upstream: Upstream, tmp_path: Path
) -> None:
    if mode == "embedded":
        with start_gateway(_config(upstream), tmp_path / "data", workers=2) as gw:
            def kill_workers() -> None:  # both: whichever holds a shard, it is killed mid-shard (pids: admin)
                pids = [w["pid"] for w in gw.http("GET", "/health", key="sk-admin").json()["workers"]]
                assert pids and gw.process.pid not in pids
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)

            _run_and_kill(gw, kill_workers)
            assert "exited with -9" in gw.log()
        return
    redis = RedisServer().start()
    try:
        with start_shared(_config(upstream), tmp_path / "data", redis.url, with_worker=False) as gw:
            config_path, storage = tmp_path / "shared.config.yaml", str(tmp_path / "data" / "blobs")
            first = start_worker(config_path, redis.url, storage).wait_ready()
            second = None
            try:
                def kill_worker() -> None:  # the one worker killed; another takes its shards over
                    nonlocal second
                    first.kill()
                    time.sleep(0.5)
                    second = start_worker(config_path, redis.url, storage).wait_ready()

                _run_and_kill(gw, kill_worker)
                with redis.client() as c:  # the batch is settled: its moves forgotten, nothing more owed
                    keys = Keys()
                    assert c.hgetall(keys.spend_moved("payer")) == {}
                    assert c.keys(f"{keys.prefix}*spend-owed") == []
            finally:
                first.close()
                if second is not None:
                    second.close()
    finally:
        redis.close()
