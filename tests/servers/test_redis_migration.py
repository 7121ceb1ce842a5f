"""A Redis written by the previous version (every key untagged: `batchyard:batch:<id>`, `batchyard:spend:<team>`,
...) keeps working after the upgrade: the first start moves its keys into the per-batch and per-team hash
slots (`gateway.store.redis.migration`), once, and a start that died mid-way is finished by the next.

The previous layout is made the honest way: a real `serve` and worker run a finished batch and half of
another (the worker SIGKILLed mid-batch), and every key is then renamed to the name the previous version's
table gave it (`previous_layout` below, the inverse of the migration's, written from the old table: not the
code under test); a team's spend and a webhook delivery are written under their old names too. Then `serve`
and a worker start on it: the batches list, the finished batch's output, the spend and the delivery read
back, and the unfinished batch completes, each line once, its queue rebuilt by the sweeper.
On a cluster the previous layout was one slot (`{batchyard}:…`): `test_a_cluster_of_the_previous_layout`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from gateway.store.redis.connection import open_redis
from gateway.store.redis.keys import Keys
from gateway.store.redis.migration import LAYOUT, migrate_layout
from gateway.store.redis.store import RedisStore
from gateway.store.webhook_deliveries import PENDING, WebhookDelivery
from tests.fakes.upstream.server import Upstream
from tests.servers.test_faults_redis import tracebacks
from tests.support.server_helpers import chat_line, gateway_config, read_jsonl, submit
from tests.support.services import (
    HAVE_REDIS,
    NO_REDIS_REASON,
    RedisClusterServers,
    RedisServer,
    WorkerProcess,
    start_worker,
)
from tests.support.team_helpers import done, finished, start_shared, until

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}]
P = "batchyard:"
# The previous table's families (gateway/store/redis/keys.py's docstring as it was)
_BATCH_FAMILIES = {"batch", "shards", "shards-done", "attempts", "route-stats", "sealed", "results"}


def previous_layout(c: redis.Redis, prefix: str = P) -> None:
    """Rename every key of this Redis under `prefix` to the previous version's name for it; drop what it did
    not have."""
    for name in [str(k) for k in c.scan_iter(match=prefix + "*", count=1000)]:
        old = _old_name(name, prefix)
        if old is None:
            c.delete(name)
        elif old != name:
            c.rename(name, old)


def _old_name(name: str, p: str) -> str | None:
    rest = name.removeprefix(p)
    if rest == "layout":
        return None
    if not rest.startswith("{"):
        return name  # untagged: the same name in both layouts (or the previous queue's own)
    tag, _, after = rest[1:].partition("}:")
    kind, _, owner = tag.partition(":")
    family, _, tail = after.partition(":")
    if kind == "b" and family in _BATCH_FAMILIES:
        return f"{p}{family}:{owner}"
    if kind == "b" and family == "journal":
        return f"{p}journal:{owner}:{tail}"
    if kind == "t" and family in ("rate", "idempotency"):
        return f"{p}{family}:{len(owner)}:{owner}:{tail}"
    if kind == "t" and family not in ("spend-moved",):
        return f"{p}{family}:{owner}" + (f":{tail}" if tail else "")
    return None  # a key the previous version had no such thing as (spend owed/moved, the new queue's)


def _stop(gw: object, workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.close()
    gw.stop()  # type: ignore[attr-defined]


def test_a_single_redis_of_the_previous_layout_is_migrated_at_start(
    redis_server: RedisServer, upstream: Upstream, tmp_path: Path,
) -> None:
    redis_server.flush()
    config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, shard_size=10)
    storage = str(tmp_path / "data" / "blobs")
    gw = start_shared(config, tmp_path / "data", redis_server.url, with_worker=False)
    workers = [start_worker(tmp_path / "shared.config.yaml", redis_server.url, storage, claim_idle=1.0)]
    try:
        workers[0].wait_ready(120)
        alpha = gw.client("sk-alpha")
        first = [chat_line(f"a-{i}", "gpt-mini", f"line {i}") for i in range(12)]
        finished_id = submit(alpha, first).id
        finished_batch = until(gw, "sk-alpha", finished_id, finished, timeout=90)
        assert finished_batch.status == "completed"
        second = [chat_line(f"b-{i}", "gpt-mini", f"#sleep:30 line {i}") for i in range(120)]
        running_id = submit(alpha, second).id
        until(gw, "sk-alpha", running_id, lambda b: done(b) >= 20, timeout=90)
        workers[0].kill()  # SIGKILL mid-batch: shards half done, some queued, some in flight
    finally:
        _stop(gw, workers)
    delivery = WebhookDelivery("wh_old", "evt_old", "alpha", finished_id, "batch.completed", int(time.time()),
                               state=PENDING, next_at=time.time() + 86_400)

    async def write_more() -> None:
        store = RedisStore(*await open_redis(redis_server.url))
        try:
            await store.webhooks.add(delivery)
        finally:
            await store.aclose()

    asyncio.run(write_more())
    with redis_server.client() as c:
        previous_layout(c)
        c.hset(f"{P}spend:alpha", "0", "2.5")  # the team's spend, as the previous version kept it
        c.xadd(f"{P}stream:8:gpt-mini:5:alpha:{running_id}", {"shard": "{}"})  # an old queue's keys: dropped
        c.hset(f"{P}queued", f"{running_id}:0", "0-1@x")
        assert c.exists(f"{P}batch:{finished_id}", f"{P}batch:{running_id}", f"{P}batches:alpha",
                        f"{P}webhooks:alpha") == 4
        assert not [k for k in c.scan_iter() if "{" in str(k)]

    # A first start that dies after 5 keys (as if killed there): the next start finishes the move.
    async def crash_part_way() -> int:
        client, keys = await open_redis(redis_server.url)
        try:
            return await migrate_layout(client, keys, limit=5)
        finally:
            await client.aclose()

    assert asyncio.run(crash_part_way()) == 5
    with redis_server.client() as c:
        assert c.get(Keys().layout) is None
        assert [k for k in c.scan_iter() if "{" in str(k)]  # some moved, the rest not

    gw = start_shared(config, tmp_path / "data", redis_server.url, with_worker=False)
    workers = [start_worker(tmp_path / "shared.config.yaml", redis_server.url, storage, claim_idle=1.0)]
    try:
        workers[0].wait_ready(120)
        alpha = gw.client("sk-alpha")
        listed = [b.id for b in alpha.batches.list(limit=10)]
        assert listed == [running_id, finished_id]
        again = alpha.batches.retrieve(finished_id)
        assert again.status == "completed" and again.output_file_id == finished_batch.output_file_id
        assert sorted(r["custom_id"] for r in read_jsonl(alpha, again.output_file_id)) == sorted(
            line["custom_id"] for line in first)
        batch = until(gw, "sk-alpha", running_id, finished, timeout=180)
        logs = "\n".join([gw.log(), *(w.log() for w in workers)])
        assert batch.status == "completed", logs[-4000:]
        assert read_jsonl(alpha, batch.error_file_id) == []
        output = [r["custom_id"] for r in read_jsonl(alpha, batch.output_file_id)]
        assert sorted(output) == sorted(line["custom_id"] for line in second)  # each once: the queue rebuilt
        assert "redis key layout 2: moved" in logs
        assert tracebacks(logs) == [], "\n".join(tracebacks(logs))
    finally:
        _stop(gw, workers)

    async def read_back() -> tuple[float, list[WebhookDelivery]]:
        store = RedisStore(*await open_redis(redis_server.url))
        try:
            return await store.quota.spend("alpha", 0), await store.webhooks.recent("alpha", 10)
        finally:
            await store.aclose()

    spend, recent = asyncio.run(read_back())
    assert spend == 2.5
    assert [(d.id, d.state) for d in recent] == [("wh_old", PENDING)]
    with redis_server.client() as c:
        assert c.get(Keys().layout) == LAYOUT
        old = [str(k) for k in c.scan_iter()
               if str(k).split(":")[1] in {"batch", "batches", "journal", "spend", "stream", "queued", "webhooks"}]
        assert old == []


async def test_a_cluster_of_the_previous_layout_is_migrated(server_binary: str) -> None:
    """The previous version kept every key of a cluster deployment under one tag (`{batchyard}:`, one slot on
    one master): DUMP + RESTORE + DEL moves each to its new slot (RENAME cannot cross slots)."""
    cluster = RedisClusterServers(3, binary=server_binary).start()
    try:
        client, keys = await open_redis(cluster.url)
        try:
            old = "{batchyard}:"
            await client.hset(f"{old}batch:batch_1", mapping={"owner": '"alpha"', "status": '"completed"'})
            await client.set(f"{old}journal:batch_1:3", "r", ex=3600)
            await client.hset(f"{old}spend:alpha", "0", "1.5")
            await client.zadd(f"{old}files:alpha:batch", {"file-1": 1.0})
            await client.hset(f"{old}rate:5:alpha:m:7", "requests", 3)
            await client.set(f"{old}meta:native", "{}")
            await client.hset(f"{old}queued", "s", "e")
            assert await migrate_layout(client, keys) == 7
            assert await client.hget(keys.batch("batch_1"), "owner") == '"alpha"'
            assert await client.get(keys.journal("batch_1", 3)) == "r"
            assert 0 < int(await client.ttl(keys.journal("batch_1", 3))) <= 3600
            assert await client.hgetall(keys.spend("alpha")) == {"0": "1.5"}
            assert await client.zrange(keys.files("alpha", "batch"), 0, -1) == ["file-1"]
            assert await client.hget(keys.rate("alpha", "m", 7), "requests") == "3"
            assert await client.get(keys.meta("native")) == "{}"
            assert await migrate_layout(client, keys) == 0  # once
        finally:
            await client.aclose()
        names = [str(k) for node in cluster.nodes for k in node.client().scan_iter()]
        assert not [n for n in names if n.startswith("{batchyard}")], names
    finally:
        cluster.close()


async def test_two_processes_starting_together_migrate_once(redis_server: RedisServer) -> None:
    """The lease: one start moves every key, the other waits for the marker and moves none."""
    redis_server.flush()
    with redis_server.client() as c:
        for i in range(300):
            c.hset(f"{P}batch:batch_{i}", "owner", '"alpha"')
    clients = [await open_redis(redis_server.url) for _ in range(2)]
    try:
        done = await asyncio.gather(*(migrate_layout(client, keys) for client, keys in clients))
    finally:
        for client, _ in clients:
            await client.aclose()
    assert sorted(done) == [0, 300]
    with redis_server.client() as c:
        assert c.get(Keys().layout) == LAYOUT
        assert c.hget(Keys().batch("batch_7"), "owner") == '"alpha"'
        assert not c.exists(f"{P}batch:batch_7", Keys().lease("layout"))
