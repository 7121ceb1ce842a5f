"""Shared mode: API replicas and workers on many machines over one Redis and one bucket.

`open_shared(config, redis_url, storage)` builds the same `Pipeline` the
embedded mode runs, over `RedisStore`, `S3Blobs` (or a shared directory) and
`RedisStreamQueue`. What a single process did by itself at start-up
(`Pipeline.recover`) becomes upkeep that every process runs, safe to run
everywhere at once:

- Heartbeats: each worker keeps `worker:{name}` alive with the routes it
  hosts, beating every `claim_idle / 3` s with a TTL of `claim_idle`; the queue
  takes a shard over only from a consumer whose heartbeat is gone (and that
  left the shard idle for `claim_idle`). `health()` lists the live workers and
  the queue per route.
- A worker that finds one of its shards taken over (it stalled for longer than
  `claim_idle`) stops running it: the taker runs the rest.
- Leases: validating and finalizing a batch happen under a lease (a key with a
  TTL, refreshed while held), so two processes never do either at once, and
  one that dies mid-way leaves a lease that expires.
- The sweeper (one process at a time, under its own lease) finds what a dead
  process left: a batch stuck in `validating` (the API replica died) is
  validated again; an unfinished shard no stream entry carries (died while
  enqueueing, or Redis lost writes) is enqueued again; a batch whose shards are
  all finished but that is not finalized (a worker died finalizing) is
  finalized. A dead worker's in-flight shards need nothing here: the queue
  reclaims them (XAUTOCLAIM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.config import Config
from gateway.pipeline import Pipeline
from gateway.records import BatchStatus
from gateway.store.base import Blobs, Delivery, now
from gateway.store.keys import Keys
from gateway.store.redis_queue import DEFAULT_CLAIM_IDLE, RedisStreamQueue, consumer_name
from gateway.store.redis_store import RedisStore

log = logging.getLogger("batchyard.distributed")

HEARTBEAT_SECONDS = 5.0
SWEEP_SECONDS = 5.0
LEASE_SECONDS = 30.0
STALE_VALIDATION_SECONDS = 10  # a batch validating this long with no lease held was left by a dead replica
S3_ENDPOINT_ENV = "BATCHYARD_S3_ENDPOINT_URL"

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def connect_redis(url: str) -> aioredis.Redis:
    """A client that rides out a Redis restart of a few seconds (retries with backoff)."""
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=30)
    return aioredis.Redis.from_url(
        url, decode_responses=True, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=15, socket_timeout=10,
    )


def open_blobs(storage: str | Path, *, endpoint_url: str | None = None) -> Blobs:
    """`s3://bucket/prefix` (S3, MinIO, moto) or a directory every process can reach."""
    text = str(storage)
    if text.startswith("s3://"):
        from gateway.store.s3 import S3Blobs

        return S3Blobs.from_url(text, endpoint_url=endpoint_url or os.environ.get(S3_ENDPOINT_ENV) or None)
    from gateway.store.local import LocalBlobs

    return LocalBlobs(Path(text))


class Leases:
    """Named leases: a key holding the holder's name, with a TTL renewed while held."""

    def __init__(self, client: aioredis.Redis, keys: Keys, holder: str, ttl: float = LEASE_SECONDS) -> None:
        self._r, self._k, self.holder, self.ttl = client, keys, holder, ttl
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    async def acquire(self, what: str, ttl: float | None = None) -> bool:
        ms = int((ttl or self.ttl) * 1000)
        return bool(await self._r.set(self._k.lease(what), self.holder, nx=True, px=ms))

    async def release(self, what: str) -> None:
        await self._release(keys=[self._k.lease(what)], args=[self.holder])

    async def held(self, what: str) -> bool:
        return bool(await self._r.exists(self._k.lease(what)))

    async def _keep(self, what: str) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                await self._renew(keys=[self._k.lease(what)], args=[self.holder, int(self.ttl * 1000)])

    @contextlib.asynccontextmanager
    async def hold(self, what: str) -> AsyncIterator[bool]:
        """Yields True while the lease is ours (renewed), False if someone else holds it."""
        if not await self.acquire(what):
            yield False
            return
        keeper = asyncio.create_task(self._keep(what), name=f"lease-{what}")
        try:
            yield True
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            with contextlib.suppress(Exception):
                await self.release(what)


class SharedPipeline(Pipeline):
    """The pipeline over shared storage, with heartbeats, leases and the sweeper."""

    def __init__(
        self, config: Config, client: aioredis.Redis, keys: Keys, blobs: Blobs, queue: RedisStreamQueue, *,
        worker_routes: Collection[str] | None, name: str, heartbeat: float = HEARTBEAT_SECONDS,
        sweep_every: float = SWEEP_SECONDS,
    ) -> None:
        super().__init__(config, RedisStore(client, keys, owns_client=False), blobs, queue,
                         worker_routes=worker_routes, recover_on_start=False)
        self.redis, self.keys, self.name = client, keys, name
        self.shared_queue = queue
        self.leases = Leases(client, keys, name)
        every = {route.model_name for route in config.routes.values()}
        self.hosted = sorted(r for r in (every if worker_routes is None else worker_routes) if r)
        self._heartbeat_every = heartbeat
        self._sweep_every = sweep_every
        self._upkeep: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[Any]] = {}  # delivery token -> the task running it
        queue.on_lost = self._lost
        self._started_at = now()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, workers: bool = True) -> None:
        await self.redis.ping()  # fail fast on a wrong URL
        if workers and self.hosted:  # backends (engines, LiteLLM's Router) start before a shard is held:
            await self.backends.warm_up()  # a slow start would stall the loop past the claim timeout
            for route in self.hosted:
                await self.backends.get(route)
        await super().start(workers=workers and bool(self.hosted))
        if workers and self.hosted:
            await self._beat()
            self._upkeep.append(asyncio.create_task(self._every(self._heartbeat_every, self._beat), name="heartbeat"))
        self._upkeep.append(asyncio.create_task(self._every(self._sweep_every, self.sweep), name="sweeper"))

    async def _every(self, seconds: float, step: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step()
            except Exception as exc:
                log.warning("%s failed: %s", getattr(step, "__name__", step), exc)

    async def aclose(self) -> None:
        for task in self._upkeep:
            task.cancel()
        for task in self._upkeep:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            async with self.redis.pipeline(transaction=True) as tx:
                tx.delete(self.keys.worker(self.name))
                tx.zrem(self.keys.workers, self.name)
                await tx.execute()
        await super().aclose()
        await self.redis.aclose()

    # -- heartbeats and health ----------------------------------------------------------

    async def _beat(self) -> None:
        info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "routes": self.hosted,
                "started_at": self._started_at, "seen_at": now()}
        ttl = max(1, int(self._heartbeat_every * 3 * 1000))
        async with self.redis.pipeline(transaction=True) as tx:
            tx.set(self.keys.worker(self.name), json.dumps(info), px=ttl)
            tx.zadd(self.keys.workers, {self.name: time.time()})
            await tx.execute()

    async def live_workers(self) -> list[dict[str, Any]]:
        names = cast(list[str], await self.redis.zrange(self.keys.workers, 0, -1))
        if not names:
            return []
        raws = await self.redis.mget([self.keys.worker(n) for n in names])
        gone = [n for n, raw in zip(names, raws, strict=True) if raw is None]
        if gone:
            await self.redis.zrem(self.keys.workers, *gone)
        return [json.loads(raw) for raw in raws if raw is not None]

    async def health(self) -> dict[str, Any]:
        waiting, in_flight = await self.shared_queue.counts()
        workers = await self.live_workers()
        served = {r for w in workers for r in w["routes"]}
        return {
            "mode": "shared",
            "queue_depth": waiting,
            "in_flight": in_flight,
            "workers": [{"name": w["name"], "host": w["host"], "pid": w["pid"], "routes": w["routes"],
                         "seen_at": w["seen_at"]} for w in workers],
            "unserved_routes": sorted(r for r in waiting if r not in served),
        }

    # -- leases around the steps two processes must not do at once ----------------------

    async def _validate(self, batch_id: str) -> None:
        async with self.leases.hold(f"validate:{batch_id}") as ours:
            if ours:
                await super()._validate(batch_id)

    async def finalize(self, batch_id: str) -> None:
        async with self.leases.hold(f"finalize:{batch_id}") as ours:
            if ours:
                await super().finalize(batch_id)

    async def _process(self, delivery: Delivery) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running[delivery.token] = task
        try:
            await super()._process(delivery)
        except asyncio.CancelledError:
            if self._running.get(delivery.token) is not None:
                raise
            # taken over by another worker (this one stalled): it runs the rest, we stop here
        except Exception:  # e.g. Redis away for longer than the client's retries: another worker takes it
            log.exception("shard %s could not be run or acknowledged; handing it back", delivery.shard.key)
            with contextlib.suppress(Exception):
                await self.shared_queue.hand_back(delivery)
        finally:
            self._running.pop(delivery.token, None)

    def _lost(self, token: str) -> None:
        task = self._running.pop(token, None)
        if task is not None:
            task.cancel()

    # -- the sweeper ------------------------------------------------------------------

    async def sweep(self) -> None:
        """Pick up what dead processes left (see the module docs). One process at a time."""
        if not await self.leases.acquire("sweep", ttl=max(self._sweep_every * 2, 5.0)):
            return
        try:
            queued = await self.shared_queue.queued()  # read before the shards: see put_missing
            for batch in await self.store.active_batches():
                await self._sweep_batch(batch.id, batch.status, batch.created_at, batch.shards_total, queued)
            alive = {w["name"] for w in await self.live_workers()}
            await self.shared_queue.forget_dead_consumers(alive.__contains__)
        finally:
            await self.leases.release("sweep")

    async def _sweep_batch(
        self, batch_id: str, status: BatchStatus, created_at: int, shards_total: int, queued: dict[str, str]
    ) -> None:
        if await self.leases.held(f"validate:{batch_id}"):
            return  # being validated or enqueued right now
        if status is BatchStatus.VALIDATING or (status is BatchStatus.CANCELLING and shards_total == 0):
            if now() - created_at < STALE_VALIDATION_SECONDS:
                return
            if status is BatchStatus.VALIDATING:
                log.warning("batch %s was left validating; validating it again", batch_id)
                self._spawn(self._validate(batch_id), f"validate-{batch_id}")
            elif await self.leases.acquire(f"validate:{batch_id}"):
                await self._fail(batch_id, [])  # cancelled while validating, before any shard existed
                await self.store.update_batch(batch_id, {"status": BatchStatus.CANCELLED, "cancelled_at": now()})
                await self.leases.release(f"validate:{batch_id}")
            return
        unfinished = await self.store.unfinished_shards(batch_id)
        if not unfinished:
            if not await self.leases.held(f"finalize:{batch_id}"):
                log.warning("batch %s has every shard finished but was not finalized; finalizing", batch_id)
                self._spawn(self.finalize(batch_id), f"finalize-{batch_id}")
            return
        for shard in unfinished:
            if shard.key in queued:
                continue
            if not shard.route:  # the shard of lines answered at validation: sealed already
                await self._finish(shard)
            elif await self.shared_queue.put_missing(shard):
                log.warning("shard %s was in no queue; enqueued it again", shard.key)


async def open_shared(
    config: Config, redis_url: str, storage: str | Path, *, worker_routes: Collection[str] | None = (),
    claim_idle: float = DEFAULT_CLAIM_IDLE, name: str | None = None, prefix: str | None = None,
    s3_endpoint_url: str | None = None,
) -> SharedPipeline:
    """The shared pipeline. `worker_routes`: the routes this process runs shards for
    (`()`: none, an API replica; `None`: every route of the config)."""
    client = connect_redis(redis_url)
    keys = Keys(prefix) if prefix else Keys()
    name = name or consumer_name()
    routes = sorted({route.model_name for route in config.routes.values()})
    queue = RedisStreamQueue(client, routes, keys=keys, consumer=name, claim_idle=claim_idle)
    blobs = open_blobs(storage, endpoint_url=s3_endpoint_url)
    # A worker's heartbeat lives as long as its shards may stay idle: a shard is taken over only
    # when both have run out.
    return SharedPipeline(config, client, keys, blobs, queue, worker_routes=worker_routes, name=name,
                          heartbeat=claim_idle / 3)


def serve_shared(
    config_path: str | Path, host: str, port: int, *, redis_url: str, storage: str | Path,
    with_worker: bool = False, claim_idle: float = DEFAULT_CLAIM_IDLE, log_level: str = "info",
) -> None:
    """`batchyard serve --redis-url U --storage s3://…`: one API replica over the shared pipeline."""
    from gateway.server.run import serve

    async def factory(config: Config) -> Pipeline:
        routes = None if with_worker else ()
        return await open_shared(config, redis_url, storage, worker_routes=routes, claim_idle=claim_idle)

    serve(config_path, host, port, log_level=log_level, pipeline_factory=factory)


__all__ = ["Leases", "SharedPipeline", "connect_redis", "open_blobs", "open_shared", "serve_shared"]
