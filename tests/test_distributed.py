"""Shared mode with real servers: redis-server, moto's S3, `batchyard worker` processes, a loopback upstream.

- `RedisStore` answers exactly as `SQLiteStore` does (one scenario, both stores).
- `S3Blobs`: single PUT, multipart, abort, streamed read, prefix delete.
- `RedisStreamQueue`: per-route streams, a live worker's long shard is never
  taken, a dead consumer's shard is taken after the idle timeout, a closing
  worker hands its shards back at once.
- Two workers, one SIGKILLed mid-batch: the batch completes, each custom_id
  once, upstream calls ≤ total + requests in flight at the kill.
- Redis restarted mid-batch (append-only file): the batch resumes and completes.
- Shards lost from the queue (Redis lost writes / a replica died enqueueing)
  are enqueued again by the sweeper.
- Two API replicas (`batchyard serve --redis-url`) answer alike for one batch.
"""

from __future__ import annotations

import asyncio
import hashlib
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
from gateway.errors import ConfigError
from gateway.records import BatchStatus, Result, Shard
from gateway.runtime import Runtime, open_shared
from gateway.store.base import BatchOptions, BatchRecord, FileRecord, Store
from gateway.store.keys import GROUP, Keys
from gateway.store.redis_coordination import connect_redis
from gateway.store.redis_queue import RedisStreamQueue
from gateway.store.redis_store import RedisStore
from gateway.store.s3 import S3Blobs
from gateway.store.sqlite_store import SQLiteStore
from tests.services import (
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
from tests.upstream import Upstream, start_upstream

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

MODEL = "gpt-mini"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def s3_env(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


@dataclass
class Cluster:
    """One Redis (append-only, so it can restart), two `batchyard worker`s and two API replicas
    (`batchyard serve --redis-url`, the second `--with-worker`), all started at once: process
    start-up (importing LiteLLM) is most of this file's time. Database 0 is theirs; unit tests
    use databases 1 and 2."""

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
    storage = s3.storage("cluster")
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


# -- RedisStore answers as SQLiteStore does -------------------------------------------------


def _batch(batch_id: str, owner: str, created: int, status: BatchStatus = BatchStatus.VALIDATING) -> BatchRecord:
    return BatchRecord(id=batch_id, owner=owner, endpoint="/v1/chat/completions", input_file_id="file_in",
                       completion_window="24h", status=status, created_at=created, expires_at=created + 86_400,
                       metadata={"k": "v"}, options=BatchOptions(strict=False, allowed_models=["m"]))


def _result(line: int, status: int | None, tokens: int = 0) -> Result:
    body = {"usage": {"prompt_tokens": tokens, "completion_tokens": 2 * tokens}} if status == 200 else None
    error = None if status else {"code": "batch_cancelled", "message": "no"}
    return Result(line=line, custom_id=f"c{line}", status_code=status, body=body, error=error,
                  request_id=f"req_{line}", id=f"batch_req_{line}", model="m")


async def _scenario(store: Store) -> list[Any]:
    """Every Store call, in the order the runtime makes them; the transcript of what came back."""
    out: list[Any] = []

    def page(p: Any) -> Any:
        return [[r.id for r in p.data], p.has_more]

    for i, (fid, created, purpose) in enumerate([("file_b", 100, "batch"), ("file_a", 100, "batch"),
                                                  ("file_c", 101, "batch_output"), ("file_d", 99, "batch")]):
        await store.put_file(FileRecord(fid, "team", 10 + i, created, f"{fid}.jsonl", purpose, None, f"files/{fid}"))
    await store.put_file(FileRecord("file_x", "other", 1, 100, "x", "batch", None, "files/file_x"))
    await store.put_file(FileRecord("file_e", "other", 1, 100, "e", "batch", 150, "files/file_e"))
    out.append([[f.id for f in await store.expired_files(at)] for at in (150, 151)])
    await store.delete_file("file_e")
    out.append([f.id for f in await store.expired_files(151)])
    out.append((await store.get_file("file_a")).to_json())  # type: ignore[union-attr]
    out.append([await store.get_file("file_a", "other"), await store.get_file("nope")])
    for order in ("asc", "desc"):
        for after in (None, "file_a", "file_b", "file_c", "gone"):
            for purpose in (None, "batch"):
                for limit in (1, 2, 10):
                    p = await store.list_files("team", purpose=purpose, limit=limit, order=order, after=after)
                    out.append([order, after, purpose, limit, page(p)])
    out.append([await store.delete_file("file_a", "other"), await store.delete_file("file_a", "team"),
                await store.delete_file("file_a")])
    out.append(page(await store.list_files("team", purpose=None, limit=10, order="asc", after=None)))

    for i, bid in enumerate(["batch_1", "batch_2", "batch_3"]):
        await store.put_batch(_batch(bid, "team", 1000 - i))  # creation order, not created_at, decides
    await store.put_batch(_batch("batch_o", "other", 5))
    for after in (None, "batch_3", "batch_2", "batch_1", "gone"):
        for limit in (1, 2, 5):
            out.append([after, limit, page(await store.list_batches("team", limit=limit, after=after))])
    out.append(await store.update_batch("batch_1", {"status": BatchStatus.IN_PROGRESS, "in_progress_at": 7},
                                        if_status={BatchStatus.VALIDATING}))
    out.append(await store.update_batch("batch_1", {"status": BatchStatus.FAILED},
                                        if_status={BatchStatus.VALIDATING, BatchStatus.CANCELLING}))
    out.append(await store.update_batch("batch_1", {"counts": {"total": 5, "completed": 0, "failed": 0},
                                                    "model": "m", "shards_total": 3, "routes": {"a": [1, 2.5]}}))
    out.append(await store.update_batch("missing", {"model": "m"}))
    shards = [Shard("batch_1", 0, "m", 2), Shard("batch_1", 1, "m", 2), Shard("batch_1", 2, "", 1)]
    await store.put_shards("batch_1", shards)
    await store.put_shards("batch_1", [Shard("batch_1", 0, "changed", 9)])  # ignored: already there
    out.append([s.to_json() for s in await store.get_shards("batch_1")])
    await store.record_results(shards[0], [_result(1, 200, 3), _result(2, 500)])
    await store.record_results(shards[0], [_result(1, 200, 3), _result(2, 200, 4)])  # both already recorded
    priced = _result(4, 200, 1)
    priced.cost_usd = 0.125
    await store.record_results(shards[1], [_result(3, None), priced])
    await store.record_results(Shard("missing", 0, "m", 1), [_result(1, 200, 5)])
    out.append(sorted(r.to_json()["line"] for r in await store.journal(shards[0])))
    out.append([r.to_json() for r in sorted(await store.journal(shards[1]), key=lambda r: r.line)])
    out.append(sorted(await store.recorded_lines(shards[1])))
    await store.drop_journal(shards[1])
    out.append([await store.journal(shards[1]), sorted(await store.recorded_lines(shards[0]))])
    out.append([await store.finish_shard(shards[0]), await store.finish_shard(shards[0]),
                await store.finish_shard(Shard("batch_1", 9, "m", 1))])
    out.append([s.index for s in await store.unfinished_shards("batch_1")])
    out.append({route: stats.to_json() for route, stats in sorted((await store.route_stats("batch_1")).items())})
    out.append([await store.begin_attempt(shards[0]), await store.begin_attempt(shards[0]),
                await store.begin_attempt(shards[1])])
    rec = await store.get_batch("batch_1")
    assert rec is not None
    out.append(rec.to_json())
    out.append(rec.to_openai())
    out.append([await store.get_batch("batch_1", "other"), await store.get_batch("missing")])
    out.append([b.id for b in await store.active_batches()])
    out.append(await store.update_batch("batch_2", {"status": BatchStatus.COMPLETED, "completed_at": 9}))
    out.append([b.id for b in await store.active_batches()])
    out.append(await store.update_batch("batch_2", {"status": "cancelling"}))
    out.append([b.id for b in await store.active_batches()])
    out.append([await store.finish_shard(shards[1]), await store.finish_shard(shards[2])])

    await store.put_meta("native:x", {"ids": ["a", "b"], "n": 1})
    out.append([await store.get_meta("native:x"), await store.get_meta("none")])
    await store.delete_meta("native:x")
    out.append(await store.get_meta("native:x"))
    return out


async def test_redis_store_answers_as_sqlite_does(cluster: Cluster, tmp_path: Path) -> None:
    sqlite = SQLiteStore(tmp_path / "s.sqlite3")
    shared = RedisStore(connect_redis(cluster.db(1)))
    try:
        expected = await _scenario(sqlite)
        got = await _scenario(shared)
    finally:
        await sqlite.aclose()
        await shared.aclose()
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"step {i}"


async def test_store_counts_each_result_once_under_concurrency(cluster: Cluster) -> None:
    store = RedisStore(connect_redis(cluster.db(1)))
    try:
        await store.put_batch(_batch("batch_c", "t", 1))
        shard = Shard("batch_c", 0, "m", 200)
        results = [_result(i, 200 if i % 2 else 429, 1) for i in range(1, 201)]
        # eight writers race over overlapping halves: every line must count once
        await asyncio.gather(*(store.record_results(shard, results[(k * 25) % 100:(k * 25) % 100 + 100])
                               for k in range(8)))
        await asyncio.gather(*(store.record_results(shard, results) for _ in range(4)))
        rec = await store.get_batch("batch_c")
        assert rec is not None
        assert (rec.counts.completed, rec.counts.failed) == (100, 100)
        assert rec.usage.input_tokens == 100 and rec.usage.output_tokens == 200
        # if_status is atomic: of many racing transitions exactly one applies
        applied = await asyncio.gather(*(store.update_batch("batch_c", {"status": BatchStatus.IN_PROGRESS},
                                                            if_status={BatchStatus.VALIDATING}) for _ in range(20)))
        assert sum(applied) == 1
    finally:
        await store.aclose()


# -- S3Blobs -------------------------------------------------------------------------------


async def _read_all(blobs: S3Blobs, key: str) -> bytes:
    return b"".join([chunk async for chunk in blobs.read(key)])


async def test_s3_blobs_put_multipart_abort_and_prefix_delete(s3: MotoS3) -> None:
    blobs = S3Blobs.from_url(s3.storage("unit"), endpoint_url=s3.url, part_size=5 * 1024 * 1024)
    try:
        w = blobs.writer("files/small")
        await w.write(b"hello\n")
        await w.write(b"world\n")
        assert await blobs.size("files/small") is None  # nothing visible before commit
        assert await w.commit() == 12
        assert await _read_all(blobs, "files/small") == b"hello\nworld\n"
        assert await blobs.size("files/small") == 12

        big = hashlib.sha256()
        w = blobs.writer("batches/b1/shards/000000.results.jsonl")
        for i in range(12):  # 12 MiB in 1 MiB writes: three parts
            chunk = bytes([i]) * (1 << 20)
            big.update(chunk)
            await w.write(chunk)
        assert await w.commit() == 12 << 20
        got = hashlib.sha256()
        async for chunk in blobs.read("batches/b1/shards/000000.results.jsonl", chunk_size=1 << 18):
            got.update(chunk)
        assert got.hexdigest() == big.hexdigest()

        w = blobs.writer("files/aborted")
        await w.write(b"x" * (6 << 20))  # a part went out already
        await w.abort()
        client = await blobs.client()
        uploads = await client.list_multipart_uploads(Bucket=s3.bucket)
        assert not uploads.get("Uploads")
        assert await blobs.size("files/aborted") is None

        w = blobs.writer("batches/b10/x")
        await w.write(b"keep")
        await w.commit()
        await blobs.delete_prefix("batches/b1")
        assert await blobs.size("batches/b1/shards/000000.results.jsonl") is None
        assert await blobs.size("batches/b10/x") == 4  # a sibling with a longer name stays
        await blobs.delete("files/small")
        assert await blobs.size("files/small") is None
        with pytest.raises(FileNotFoundError):
            await _read_all(blobs, "files/small")
        with pytest.raises(ValueError):
            blobs.writer("../escape")
    finally:
        await blobs.aclose()


# -- RedisStreamQueue ----------------------------------------------------------------------


async def test_queue_routes_refresh_reclaim_and_hand_back(cluster: Cluster) -> None:
    url = cluster.db(1)
    client = connect_redis(url)
    keys = Keys()
    a = RedisStreamQueue(client, ["gpu", "api"], consumer="a", claim_idle=1.0)
    b = RedisStreamQueue(client, ["gpu", "api"], consumer="b", claim_idle=1.0)
    try:
        await a.put(Shard("batch_q", 0, "gpu", 1))
        await a.put(Shard("batch_q", 1, "api", 1))
        assert await a.depth() == {"gpu": 1, "api": 1}
        got = await b.get({"api"}, timeout=0.2)  # b hosts only the upstream route
        assert got is not None and got.shard.route == "api"
        assert await b.get({"api"}, timeout=0.2) is None
        held = await a.get({"gpu"}, timeout=0.2)
        assert held is not None and held.shard.index == 0
        assert await a.depth() == {}
        assert await a.counts() == ({}, {"gpu": 1, "api": 1})

        # a live worker's long shard is refreshed: b never takes it, however long it runs
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            assert await b.get({"gpu"}, timeout=0.2) is None
        await a.ack(held)
        await b.ack(got)
        assert await a.counts() == ({}, {})
        assert await a.queued() == {}

        # a consumer that never refreshes keeps its shard while its heartbeat key lives…
        await a.put(Shard("batch_q", 2, "gpu", 1))
        stream = keys.stream("gpu")
        await client.set(keys.worker("dead"), "{}")
        await client.xreadgroup(GROUP, "dead", {stream: ">"}, count=1)
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:
            assert await b.get({"gpu"}, timeout=0.2) is None
        # …and loses it once the heartbeat is gone and the shard is idle for the timeout
        await client.delete(keys.worker("dead"))
        started = time.monotonic()
        taken = None
        while taken is None and time.monotonic() - started < 5:
            taken = await b.get({"gpu"}, timeout=0.2)
        assert taken is not None and taken.shard.index == 2
        await b.ack(taken)

        # a closing worker hands its shards back: taken at the next reclaim, not after the idle timeout
        c = RedisStreamQueue(connect_redis(url), ["gpu"], consumer="c", claim_idle=60.0,
                             owns_client=True)
        b60 = RedisStreamQueue(client, ["gpu"], consumer="b60", claim_idle=60.0)
        await c.put(Shard("batch_q", 3, "gpu", 1))
        assert (await c.get(None, timeout=0.2)) is not None
        await c.aclose()
        back = await b60.get(None, timeout=0.2)
        assert back is not None and back.shard.index == 3
        # put_missing enqueues only a shard no entry carries
        assert not await b60.put_missing(Shard("batch_q", 3, "gpu", 1))
        await b60.ack(back)
        assert await b60.put_missing(Shard("batch_q", 3, "gpu", 1))
        await b60.aclose()
        # consumers that hold nothing and are not alive are forgotten (one per worker start would pile up)
        await b.forget_dead_consumers({"a", "b"}.__contains__, idle=0)
        names = {c["name"] for c in await client.xinfo_consumers(stream, GROUP)}
        assert "dead" not in names and "c" not in names and {"a", "b"} <= names
    finally:
        await a.aclose()
        await b.aclose()
        await client.aclose()


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
    deadline = time.monotonic() + timeout
    while True:
        batch = await api.store.get_batch(batch_id)
        assert batch is not None
        if batch.status.finished:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status.value}: {batch.counts}"
        await asyncio.sleep(0.1)


async def _output(api: Runtime, batch: BatchRecord) -> list[dict[str, Any]]:
    assert batch.output_file_id is not None
    data = b"".join([c async for c in api.blobs.read(f"files/{batch.output_file_id}")])
    return [json.loads(line) for line in data.splitlines()]


def _check_exactly_once(out: list[dict[str, Any]], lines: list[dict[str, Any]]) -> None:
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]  # once each, input order
    assert all(o["response"]["status_code"] == 200 for o in out)


def _counted(upstream: Upstream, tag: str) -> Counter[str]:
    return Counter({k: v for k, v in upstream.stats()["by_custom"].items() if f" {tag} " in k})


async def _pid_with_shards(api: Runtime, redis_url: str, pids: set[int]) -> int:
    """One of `pids` (live worker processes) that holds shards right now."""
    client = connect_redis(redis_url)
    while True:
        pending = await client.xpending(Keys().stream(MODEL), GROUP)
        busy = {c["name"] for c in pending["consumers"] if int(c["pending"]) > 0}
        for w in await api.coordination.live_workers():
            if w["name"] in busy and int(w["pid"]) in pids:
                return int(w["pid"])
        await asyncio.sleep(0.02)


async def _until_completed(api: Runtime, batch_id: str, n: int) -> BatchRecord:
    while True:
        rec = await api.store.get_batch(batch_id)
        assert rec is not None
        if rec.counts.completed >= n or rec.status.finished:
            return rec
        await asyncio.sleep(0.02)


async def test_sweeper_enqueues_shards_lost_from_the_queue(cluster: Cluster, upstream: Upstream) -> None:
    url = cluster.db(2)
    api = await open_shared(cluster.config, url, cluster.storage)
    worker = await open_shared(cluster.config, url, cluster.storage, routes=[MODEL], claim_idle=2.0)
    try:
        await api.start()
        lines = _lines(40, 0, "swept")
        batch_id = await _submit(api, lines)
        while (rec := await api.store.get_batch(batch_id)) is not None and rec.status is BatchStatus.VALIDATING:
            await asyncio.sleep(0.05)
        while await api.coordination.held(f"validate:{batch_id}"):
            await asyncio.sleep(0.05)
        # Redis lost the queue (or the replica died while enqueueing): no entry carries the shards
        await connect_redis(url).delete(Keys().stream(MODEL), Keys().queued)
        await worker.start()
        await api.coordinator.sweep()
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
    deadline = time.monotonic() + 60
    while (seen := b.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
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
        lines = _lines(240, 200, "kill")
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
           "--redis-url", redis_url, "--storage", storage, "--claim-idle", "2", *extra]
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
