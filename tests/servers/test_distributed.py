"""Shared mode with real servers: redis-server, moto's S3, `batchyard worker` processes, a loopback upstream.

(The parts alone: `tests/servers/test_store_parity.py` (SQLite and Redis answer alike,
local and S3 blobs too) and `tests/servers/test_redis_queue.py`.)

- Two workers, one SIGKILLed mid-batch: the batch completes, each custom_id
  once, upstream calls ≤ total + requests in flight at the kill.
- Redis restarted mid-batch (append-only file): the batch resumes and completes.
- Shards lost from the queue (Redis lost writes / a replica died enqueueing)
  are enqueued again by the sweeper.
- Two API replicas (`batchyard serve --redis-url`) answer alike for one batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.worker import hosted_routes
from gateway.config.schema import Config, parse_config
from gateway.domain import BatchStatus
from gateway.errors import ConfigError
from gateway.runtime.runtime import Runtime, open_shared
from gateway.store.records import BatchRecord
from gateway.store.redis.connection import connect_redis
from gateway.store.redis.keys import GROUP, Keys
from tests.fakes.upstream.server import Upstream
from tests.support.services import (
    HAVE_REDIS,
    NO_REDIS_REASON,
    REPO_ROOT,
    MotoS3,
    RedisServer,
    WorkerProcess,
    free_port,
    process_env,
    shared_config,
    start_worker,
    write_config,
)
from tests.support.waiting import eventually, eventually_async

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

MODEL = "gpt-mini"


@pytest.fixture(autouse=True)
def s3_env(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)


@dataclass
class Cluster:
    """One Redis (append-only, so it can restart), two `batchyard worker`s and two API replicas
    (`batchyard serve --redis-url`, the second `--with-worker`), all started at once: process
    start-up (importing LiteLLM) is most of this file's time. Database 0 is theirs; the sweeper test
    uses database 2."""

    redis: RedisServer
    workers: list[WorkerProcess]
    replicas: list[tuple[subprocess.Popen[bytes], str, Path]]
    config: Config
    storage: str

    def db(self, n: int) -> str:
        with self.redis.client() as c:
            c.execute_command("SELECT", n)
            c.execute_command("FLUSHDB")
        return self.redis.url.rsplit("/", 1)[0] + f"/{n}"


@pytest.fixture(scope="module")
def cluster(s3: MotoS3, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    raw = shared_config(upstream.v1_url, (MODEL,), shard_size=10, max_concurrency=8, max_shards_in_flight=2)
    config_path = write_config(tmp_path_factory.mktemp("cluster") / "config.yaml", raw)
    server = RedisServer(appendonly=True).start()
    storage = s3.location("cluster")
    workers = [start_worker(config_path, server.url, storage, env=s3.env(), claim_idle=2.0) for _ in range(2)]
    replicas = [_serve(config_path, server.url, storage, s3.env()),
                _serve(config_path, server.url, storage, s3.env(), "--with-worker")]
    try:
        for w in workers:
            w.wait_ready()
        for proc, url, log in replicas:
            _wait_http(proc, url, log)
        yield Cluster(server, workers, replicas, parse_config(raw), storage)
    finally:
        for w in workers:
            w.close()
        for proc, _, log in replicas:
            _stop(proc)
            log.unlink(missing_ok=True)
        server.close()


# -- workers over a loopback upstream --------------------------------------------------------


def _lines(n: int, sleep_ms: int, tag: str) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": [{"role": "user", "content": f"#count #sleep:{sleep_ms} {tag} {i}"}]}}
            for i in range(n)]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _submit(api: Runtime, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = await api.service.upload_file("", "input.jsonl", "batch", _chunks(data))
    batch = await api.service.create_batch("", input_file_id=source.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
    return batch.id


async def _wait(api: Runtime, batch_id: str, timeout: float = 60) -> BatchRecord:
    async def finished() -> BatchRecord | None:
        batch = await api.store.batches.get(batch_id)
        assert batch is not None
        return batch if batch.status.finished else None

    return await eventually_async(finished, timeout, f"batch {batch_id} to finish", interval=0.1)


async def _output(api: Runtime, batch: BatchRecord) -> list[dict[str, Any]]:
    assert batch.output_file_id is not None
    data = b"".join([c async for c in api.blobs.read(f"files/{batch.output_file_id}")])
    return [json.loads(line) for line in data.splitlines()]


def _check_exactly_once(out: list[dict[str, Any]], lines: list[dict[str, Any]]) -> None:
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]  # once each, input order
    assert all(o["response"]["status_code"] == 200 for o in out)


def _counted(upstream: Upstream, tag: str) -> Counter[str]:
    return Counter({k: v for k, v in upstream.stats()["by_custom"].items() if f" {tag} " in k})


async def _pid_with_shards(api: Runtime, redis_url: str, pids: set[int], timeout: float = 30) -> int:
    """One of `pids` (live worker processes) that holds shards right now."""
    client = connect_redis(redis_url)
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "no live worker held a shard (did the batch finish first?)"
        busy = set()
        teams = await client.hkeys(Keys().teams(MODEL))
        for stream in [s for team in teams for s in await client.smembers(Keys().streams(MODEL, team))]:
            pending = await client.xpending(stream, GROUP)
            busy |= {c["name"] for c in pending["consumers"] if int(c["pending"]) > 0}
        for w in await api.coordination.live_workers():
            if w["name"] in busy and int(w["pid"]) in pids:
                return int(w["pid"])
        await asyncio.sleep(0.02)


async def _until_completed(api: Runtime, batch_id: str, n: int, timeout: float = 60) -> BatchRecord:
    async def completed() -> BatchRecord | None:
        rec = await api.store.batches.get(batch_id)
        assert rec is not None
        return rec if rec.counts.completed >= n or rec.status.finished else None

    return await eventually_async(completed, timeout, f"{n} lines completed", interval=0.02)


async def test_sweeper_enqueues_shards_lost_from_the_queue(cluster: Cluster, upstream: Upstream) -> None:
    url = cluster.db(2)
    api = await open_shared(cluster.config, url, cluster.storage)
    worker = await open_shared(cluster.config, url, cluster.storage, routes=[MODEL], claim_idle=2.0)
    try:
        await api.start()
        lines = _lines(40, 0, "swept")
        batch_id = await _submit(api, lines)
        while (rec := await api.store.batches.get(batch_id)) is not None and rec.status is BatchStatus.VALIDATING:
            await asyncio.sleep(0.05)
        while await api.coordination.held(f"validate:{batch_id}"):
            await asyncio.sleep(0.05)
        # Redis lost the queue (or the replica died while enqueueing): no entry carries the shards
        lost = connect_redis(url)
        team = rec.owner if rec is not None else ""
        queue_keys = Keys().streams(MODEL, team), Keys().queued(MODEL, team)
        await lost.delete(*await lost.smembers(queue_keys[0]), *queue_keys)
        await worker.start()
        await api.sweeper.sweep()
        batch = await _wait(api, batch_id, timeout=60)
        assert batch.status is BatchStatus.COMPLETED
        _check_exactly_once(await _output(api, batch), lines)
        assert set(_counted(upstream, "swept").values()) == {1}
        health = await api.health()
        assert [w["routes"] for w in health["workers"]] == [[MODEL]]
    finally:
        await worker.aclose()
        await api.aclose()


def test_two_api_replicas_answer_alike(cluster: Cluster) -> None:
    import httpx
    from openai import OpenAI

    a, b = (OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) for _, url, _ in cluster.replicas)
    lines = _lines(30, 0, "http")
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = a.files.create(file=("in.jsonl", data), purpose="batch")
    assert b.files.retrieve(source.id) == source
    batch = a.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    seen = eventually(lambda: (x := b.batches.retrieve(batch.id)).status in ("completed", "failed") and x, 60,
                      "the batch to finish", interval=0.2)
    assert seen.status == "completed"
    assert a.batches.retrieve(batch.id) == seen
    assert [x.id for x in a.batches.list()] == [x.id for x in b.batches.list()]
    assert [f.id for f in a.files.list()] == [f.id for f in b.files.list()]
    assert seen.output_file_id is not None
    out_a, out_b = a.files.content(seen.output_file_id).content, b.files.content(seen.output_file_id).content
    assert out_a == out_b
    _check_exactly_once([json.loads(x) for x in out_a.splitlines()], lines)
    health = httpx.get(cluster.replicas[0][1] + "/health", timeout=5).json()
    assert health["mode"] == "shared" and len(health["workers"]) == 3  # two workers, one replica --with-worker
    assert health["queue_depth"] == {}


def test_cancel_on_one_replica_stops_the_workers(cluster: Cluster) -> None:
    from openai import OpenAI

    a, b = (OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) for _, url, _ in cluster.replicas)
    lines = _lines(200, 300, "cancel")
    source = b.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()),
                            purpose="batch")
    batch = b.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (seen := a.batches.retrieve(batch.id)).request_counts is None or seen.request_counts.completed < 20:
        assert time.monotonic() < deadline and seen.status in ("validating", "in_progress"), seen
        time.sleep(0.1)
    assert a.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    while (seen := b.batches.retrieve(batch.id)).status != "cancelled":
        assert time.monotonic() < deadline and seen.status == "cancelling", seen
        time.sleep(0.1)
    assert seen.request_counts is not None and 20 <= seen.request_counts.completed < 200
    assert seen.output_file_id is not None and seen.error_file_id is not None
    done = [json.loads(x) for x in b.files.content(seen.output_file_id).content.splitlines()]
    stopped = [json.loads(x) for x in a.files.content(seen.error_file_id).content.splitlines()]
    assert len(done) == seen.request_counts.completed  # finished results kept…
    assert {e["error"]["code"] for e in stopped} == {"batch_cancelled"}  # …the rest never ran
    assert sorted(x["custom_id"] for x in done + stopped) == sorted(x["custom_id"] for x in lines)


async def test_redis_restart_mid_batch(cluster: Cluster, upstream: Upstream) -> None:
    api = await open_shared(cluster.config, cluster.redis.url, cluster.storage)
    try:
        await api.start()
        lines = _lines(150, 200, "restart")
        batch_id = await _submit(api, lines)
        rec = await _until_completed(api, batch_id, 30)
        assert not rec.status.finished
        await asyncio.to_thread(cluster.redis.restart, 1.0)
        batch = await _wait(api, batch_id, timeout=90)
        assert batch.status is BatchStatus.COMPLETED
        assert (batch.counts.completed, batch.counts.failed) == (150, 0)
        _check_exactly_once(await _output(api, batch), lines)
        assert len(_counted(upstream, "restart")) == 150
        assert all(w.alive() for w in cluster.workers), [w.log() for w in cluster.workers]
    finally:
        await api.aclose()


async def test_sigkill_one_worker_mid_batch(cluster: Cluster, upstream: Upstream) -> None:
    api = await open_shared(cluster.config, cluster.redis.url, cluster.storage)
    try:
        await api.start()
        lines = _lines(240, 500, "kill")  # slow answers: the batch must still be running when a worker dies
        arrived_before = upstream.stats()["requests"]  # the upstream counts a request when it arrives…
        batch_id = await _submit(api, lines)
        rec = await _until_completed(api, batch_id, 60)
        assert not rec.status.finished
        victim = await _pid_with_shards(api, cluster.redis.url, {w.process.pid for w in cluster.workers})
        recorded_before = rec.counts.completed + rec.counts.failed
        os.kill(victim, signal.SIGKILL)
        sent_by_then = upstream.stats()["requests"] - arrived_before  # …and `#count` texts when it answers
        batch = await _wait(api, batch_id)
        assert batch.status is BatchStatus.COMPLETED
        assert (batch.counts.total, batch.counts.completed, batch.counts.failed) == (240, 240, 0)
        _check_exactly_once(await _output(api, batch), lines)
        counts = _counted(upstream, "kill")
        assert len(counts) == 240
        in_flight_at_kill = sent_by_then - recorded_before
        logs = [w.log() for w in cluster.workers] + [log.read_text(errors="replace") for _, _, log in cluster.replicas]
        takeovers = [line for text in logs for line in text.splitlines() if "taken over" in line]
        assert sum(counts.values()) <= 240 + in_flight_at_kill, (sum(counts.values()), in_flight_at_kill, takeovers)
        assert max(counts.values()) <= 2
        assert sum(w.alive() for w in cluster.workers) == 1
    finally:
        await api.aclose()


# -- processes ---------------------------------------------------------------------------------


def _serve(config_path: Path, redis_url: str, storage: str, env: dict[str, str], *extra: str
           ) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    fd, log = tempfile.mkstemp(prefix="serve-", suffix=".log")
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path), "--port", str(port),
           "--redis-url", redis_url, "--blobs", storage, "--claim-idle", "2", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(env), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
    os.close(fd)
    return proc, f"http://127.0.0.1:{port}", Path(log)


def _wait_http(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_a_worker_hosts_every_upstream_route_and_the_local_models_it_names(upstream: Upstream) -> None:
    raw = shared_config(upstream.v1_url, (MODEL, "gpt-big"))
    raw["model_list"] += [{"model_name": name, "litellm_params": {"model": f"vllm/models/{name}"}}
                          for name in ("llama", "qwen")]
    config = parse_config(raw)
    assert hosted_routes(config, None) == ["gpt-big", MODEL, "llama", "qwen"]
    assert hosted_routes(config, ["qwen"]) == ["gpt-big", MODEL, "qwen"]
    assert hosted_routes(config, [MODEL]) == ["gpt-big", MODEL]
    with pytest.raises(ConfigError):
        hosted_routes(config, ["nope"])


def test_worker_command_checks_its_arguments(tmp_path: Path, upstream: Upstream) -> None:
    config = write_config(tmp_path / "c.yaml", shared_config(upstream.v1_url, (MODEL,)))
    base = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(config)]
    no_url = subprocess.run(base, cwd=REPO_ROOT, env=process_env(), capture_output=True, text=True, timeout=60)
    assert no_url.returncode == 2 and "--redis-url" in no_url.stderr
    bad_model = subprocess.run([*base, "--redis-url", "redis://127.0.0.1:1/0", "--models", "nope"], cwd=REPO_ROOT,
                               env=process_env(), capture_output=True, text=True, timeout=60)
    assert bad_model.returncode == 2 and "nope" in bad_model.stderr
