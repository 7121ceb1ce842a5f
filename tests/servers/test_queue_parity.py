"""The shared `Queue` and `Coordination` (Redis Streams, Redis keys) answer as the embedded ones (SQLite) do.

Each scenario runs once per mode, through the protocols only, with two processes' worth of parts (`a` and
`b`, each a queue consumer and a lease holder of its own name); the transcripts of what came back are equal,
step by step:

- Queue: routes, input order within a batch, `skip_teams` / `skip_batches`, counts, `queued`,
  `put_missing`, `hand_back`, `ack`; a live worker's shard is never taken, a dead one's is.
- Coordination: leases (one holder, release by the holder only, expiry, `lease` blocks), heartbeats
  (`live_workers` until the TTL runs out or `gone`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.domain import Shard
from gateway.store.protocols import Coordination, Queue
from gateway.store.records import Delivery
from gateway.store.redis.connection import connect_redis, open_redis
from gateway.store.redis.coordination import RedisCoordination
from gateway.store.redis.queue import RedisStreamQueue
from gateway.store.sqlite.coordination import SQLiteCoordination
from gateway.store.sqlite.queue import SQLiteQueue
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

ROUTES = ("api", "gpu")
CLAIM_IDLE = 1.0  # Redis: a dead consumer's shard is taken after this long idle (SQLite: at once)
WAIT = 3 * CLAIM_IDLE  # long enough for either to hand a shard over



@dataclass
class Worker:
    """One process's parts, as a worker of that name holds them."""

    queue: Queue
    coordination: Coordination
    die: Callable[[], Awaitable[None]]  # stop as a killed process stops: no hand-back, no more refreshes


Open = Callable[[str], Worker]


async def _nothing() -> None:
    return None


@contextlib.asynccontextmanager
async def _embedded(tmp_path: Path) -> AsyncIterator[Open]:
    opened: list[SQLiteQueue | SQLiteCoordination] = []

    def open_(name: str) -> Worker:
        queue, coordination = SQLiteQueue(tmp_path / "q.sqlite3", consumer=name), SQLiteCoordination(
            tmp_path / "q.sqlite3", name)
        opened.extend((queue, coordination))
        return Worker(queue, coordination, _nothing)  # its heartbeat is all that said it was alive

    try:
        yield open_
    finally:
        for part in opened:
            await part.aclose()


@contextlib.asynccontextmanager
async def _shared(redis: RedisServer | RedisClusterServers) -> AsyncIterator[Open]:
    redis.flush()
    client, keys = await open_redis(redis.url)  # a cluster's keys in one slot, as open_shared has them
    opened: list[RedisStreamQueue] = []

    def open_(name: str) -> Worker:
        queue = RedisStreamQueue(client, ROUTES, keys=keys, consumer=name, claim_idle=CLAIM_IDLE)
        opened.append(queue)

        async def die() -> None:  # a live consumer refreshes what it holds; a killed one stops
            if queue._refresher is not None:
                queue._refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await queue._refresher
            queue._held.clear()

        return Worker(queue, RedisCoordination(client, keys, name), die)

    try:
        yield open_
    finally:
        for queue in opened:
            await queue.aclose()
        await client.aclose()


def _key(delivery: Delivery | None) -> str | None:
    return None if delivery is None else delivery.shard.key


async def _queue(open_: Open) -> list[Any]:
    """Every `Queue` call, as two live workers and a dead one make them."""
    wa, wb, dead = open_("a"), open_("b"), open_("dead")
    a, b = wa.queue, wb.queue
    await wa.coordination.beat("a", {"name": "a"}, 60)
    await wb.coordination.beat("b", {"name": "b"}, 60)
    out: list[Any] = []
    for shard in [Shard("batch_1", 0, "gpu", 1, "t", 100), Shard("batch_1", 1, "gpu", 1, "t", 100),
                  Shard("batch_1", 2, "api", 1, "t", 100), Shard("batch_2", 0, "gpu", 1, "u", 200)]:
        await a.put(shard)
    out.append([await a.counts(), sorted(await a.queued())])
    api = await b.get({"api"}, timeout=0.1)  # b asks for one route only
    out.append([_key(api), _key(await b.get({"api"}, timeout=0.1))])
    # skip a team, then a batch: what is left is the other's first shard in input order
    out.append(_key(first := await a.get({"gpu"}, timeout=0.1, skip_teams={"t"})))
    out.append(_key(second := await a.get({"gpu"}, timeout=0.1, skip_batches={"batch_2"})))
    out.append([await b.counts(), sorted(await b.queued())])
    # put_missing: only a shard no entry carries, held or waiting
    out.append([await b.put_missing(Shard("batch_1", 0, "gpu", 1, "t", 100)),
                await b.put_missing(Shard("batch_1", 1, "gpu", 1, "t", 100)),
                await b.put_missing(Shard("batch_3", 0, "api", 1, "t", 300))])
    assert api is not None and first is not None and second is not None
    await b.ack(api)
    await a.hand_back(first)  # given up unacked: another worker takes it without waiting for it to go idle
    out.append(_key(back := await b.get({"gpu"}, timeout=WAIT, skip_teams={"t"})))
    # a live worker's shard stays its own however long it runs: b finds only the one that waits
    out.append(_key(waiting := await b.get({"gpu"}, timeout=0.5)))
    out.append(_key(await b.get({"gpu"}, timeout=CLAIM_IDLE * 1.5)))
    # a dead worker's shard (no heartbeat) is taken over
    out.append(_key(await dead.queue.get({"api"}, timeout=0.1)))
    await dead.die()
    out.append(_key(taken := await b.get({"api"}, timeout=WAIT)))
    assert back is not None and waiting is not None and taken is not None
    for queue, delivery in ((a, second), (b, back), (b, waiting), (b, taken)):
        await queue.ack(delivery)
    out.append([await a.counts(), sorted(await a.queued())])
    return out


async def _coordination(open_: Open) -> list[Any]:
    """Every `Coordination` call: leases between two holders, heartbeats."""
    a, b = open_("a").coordination, open_("b").coordination
    out: list[Any] = []
    out.append([await a.acquire("x", 30), await b.acquire("x", 30), await a.held("x"), await b.held("y")])
    await b.release("x")  # not b's: nothing happens
    out.append(await a.held("x"))
    await a.release("x")
    out.append([await a.held("x"), await b.acquire("x", 30)])
    async with a.lease("y") as ours, b.lease("y") as theirs:
        out.append([ours, theirs, await b.held("y")])
    out.append(await b.held("y"))  # released when the block ended
    await a.acquire("z", 0.2)
    await asyncio.sleep(0.3)
    out.append([await a.held("z"), await b.acquire("z", 30)])  # an expired lease is anyone's
    await a.beat("w1", {"name": "w1", "routes": ["gpu"]}, 60)
    await a.beat("w2", {"name": "w2"}, 0.2)
    out.append(await b.live_workers())
    await asyncio.sleep(0.3)
    out.append(await b.live_workers())  # w2's heartbeat ran out
    await a.gone("w1")
    out.append(await b.live_workers())
    return out


SCENARIOS: dict[str, Callable[[Open], Awaitable[list[Any]]]] = {"queue": _queue, "coordination": _coordination}


@pytest.mark.parametrize("concept", sorted(SCENARIOS))
async def test_shared_queue_and_coordination_answer_as_embedded_ones_do(
    concept: str, any_redis: RedisServer | RedisClusterServers, tmp_path: Path
) -> None:
    async with _embedded(tmp_path) as open_:
        expected = await SCENARIOS[concept](open_)
    async with _shared(any_redis) as open_:
        got = await SCENARIOS[concept](open_)
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"{concept}, step {i}"


def _lane(route: str) -> str:
    """As `Config.lane`: the concrete models of a wildcard route (here `w-…`) queue under its pattern."""
    return "*" if route.startswith("w-") else route


async def test_a_wildcard_routes_models_queue_under_its_pattern(redis_server: RedisServer, tmp_path: Path) -> None:
    async def scenario(queue: Queue) -> list[Any]:
        for shard in [Shard("batch_1", 0, "w-gpt-4o", 1, "t", 100), Shard("batch_1", 1, "w-claude", 1, "t", 100),
                      Shard("batch_1", 2, "api", 1, "t", 100)]:
            await queue.put(shard)
        out: list[Any] = [await queue.counts()]
        taken = [await queue.get({"*"}, timeout=0.1) for _ in range(3)]  # a worker hosting the pattern
        out.append([d.shard.route if d is not None else None for d in taken])  # each shard keeps its own route
        for delivery in taken:
            if delivery is not None:
                await queue.ack(delivery)
        out.append(await queue.counts())
        return out

    embedded = SQLiteQueue(tmp_path / "q.sqlite3", consumer="a", lane=_lane)
    try:
        expected = await scenario(embedded)
    finally:
        await embedded.aclose()
    with redis_server.client() as c:
        c.flushall()
    client = connect_redis(redis_server.url)
    shared = RedisStreamQueue(client, ("*", "api"), consumer="a", claim_idle=CLAIM_IDLE, lane=_lane)
    try:
        got = await scenario(shared)
    finally:
        await shared.aclose()
        await client.aclose()
    assert expected == got
    assert expected[0][0] == {"*": 2, "api": 1} and expected[1] == ["w-gpt-4o", "w-claude", None]
