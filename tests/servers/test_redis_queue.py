"""`RedisStreamQueue` against a real redis-server.

A stream per (route, team, batch); a live worker's long shard is never taken; a dead
consumer's shard is taken after the idle timeout; a closing worker hands its
shards back at once; `put_missing` enqueues only a shard no entry carries;
consumers that are not alive are forgotten.
"""

from __future__ import annotations

import time

import pytest

from gateway.domain import Shard
from gateway.store.redis.connection import connect_redis
from gateway.store.redis.coordination import RedisCoordination
from gateway.store.redis.keys import GROUP, Keys
from gateway.store.redis.queue import RedisStreamQueue
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]


async def test_queue_routes_refresh_reclaim_and_hand_back(redis_server: RedisServer) -> None:
    url = redis_server.url
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
        stream = keys.stream("gpu", "", "batch_q")  # one stream per (route, team, batch)
        heartbeats = RedisCoordination(client, keys, "dead")
        await heartbeats.beat("dead", {"name": "dead"}, 60)
        await client.xreadgroup(GROUP, "dead", {stream: ">"}, count=1)
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:
            assert await b.get({"gpu"}, timeout=0.2) is None
        # …and loses it once the heartbeat is gone and the shard is idle for the timeout
        await heartbeats.gone("dead")
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
        assert await b60.get(None, timeout=0.2) is not None  # b60 reads it, holds it, and stops (not alive)
        await b60.aclose()
        # consumers that hold nothing and are not alive are forgotten (one per worker start would pile up)
        await b.forget_dead_consumers({"a", "b"}.__contains__, idle=0)
        names = {c["name"] for c in await client.xinfo_consumers(stream, GROUP)}
        assert "c" not in names and "b60" not in names and "handed-back" in names
        # a batch's stream goes once it carries nothing: its consumers with it
        again, started = None, time.monotonic()
        while again is None and time.monotonic() - started < 3:
            again = await b.get({"gpu"}, timeout=0.2)  # taken back at b's next reclaim
        assert again is not None and again.shard.index == 3
        await b.ack(again)
        assert not await client.exists(stream) and await a.queued() == {} and await a.counts() == ({}, {})
    finally:
        await a.aclose()
        await b.aclose()
        await client.aclose()
