"""The shared `Coordination`: leases and heartbeats in Redis.

- Leases: a key holding the holder's name, with a TTL renewed while held, so
  two processes never validate or finalize one batch at once, and one that
  dies mid-way leaves a lease that expires.
- Heartbeats: `worker:{name}` with a TTL, and the `workers` zset of names. The
  Redis queue takes a shard over only from a consumer whose heartbeat is gone.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.leases import hold
from gateway.store.redis.keys import Keys

LEASE_SECONDS = 30.0

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# How a command is tried again on a lost connection. A worker: 30 times with backoff (0.1 s, doubling, at most
# 1 s), riding out a Redis restart of ~25 s. An API replica: once, at once, so a stale connection is replaced
# while a Redis that is gone answers 503 in milliseconds instead of holding every request (3 retries with
# backoff held each for 0.7 s); the SDKs retry a 503 themselves, and the openai SDK's POSTs carry an
# Idempotency-Key, which create honours.
WORKER_RETRIES = 30
API_RETRIES = 1


class _Script(AsyncScript):
    """redis-py's script, loaded again when Redis forgot it more than once in one call.

    redis-py loads a script again on NOSCRIPT and calls it once more; a Redis that restarts (its script
    cache is empty) around that second call answered NOSCRIPT again, and the caller met the error."""

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        for _ in range(3):
            with contextlib.suppress(NoScriptError):
                return await super().__call__(keys, args, client)
        return await super().__call__(keys, args, client)


class _Redis(aioredis.Redis):
    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]  # the async one
        return _Script(self, script)


def connect_redis(url: str, retries: int = WORKER_RETRIES) -> aioredis.Redis:
    """A client that rides out a Redis restart (retries with backoff; `retries`: how patient; 1: once, at once)."""
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05) if retries > 1 else NoBackoff(), retries=retries)
    return _Redis.from_url(
        url, decode_responses=True, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=15, socket_timeout=10,
    )


class RedisCoordination:
    def __init__(self, client: aioredis.Redis, keys: Keys, holder: str, ttl: float = LEASE_SECONDS) -> None:
        self._r, self._k, self.holder, self.ttl = client, keys, holder, ttl
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    # -- leases ------------------------------------------------------------------

    async def acquire(self, what: str, ttl: float | None = None) -> bool:
        ms = int((ttl or self.ttl) * 1000)
        return bool(await self._r.set(self._k.lease(what), self.holder, nx=True, px=ms))

    async def release(self, what: str) -> None:
        await self._release(keys=[self._k.lease(what)], args=[self.holder])

    async def held(self, what: str) -> bool:
        return bool(await self._r.exists(self._k.lease(what)))

    async def renew(self, what: str) -> None:
        await self._renew(keys=[self._k.lease(what)], args=[self.holder, int(self.ttl * 1000)])

    def lease(self, what: str) -> contextlib.AbstractAsyncContextManager[bool]:
        return hold(self, what)

    # -- heartbeats ----------------------------------------------------------------

    async def beat(self, name: str, info: dict[str, Any], ttl: float) -> None:
        async with self._r.pipeline(transaction=True) as tx:
            tx.set(self._k.worker(name), json.dumps(info), px=max(1, int(ttl * 1000)))
            tx.zadd(self._k.workers, {name: time.time()})
            await tx.execute()

    async def gone(self, name: str) -> None:
        async with self._r.pipeline(transaction=True) as tx:
            tx.delete(self._k.worker(name))
            tx.zrem(self._k.workers, name)
            await tx.execute()

    async def live_workers(self) -> list[dict[str, Any]]:
        names = cast(list[str], await self._r.zrange(self._k.workers, 0, -1))
        if not names:
            return []
        raws = await self._r.mget([self._k.worker(n) for n in names])
        dead = [n for n, raw in zip(names, raws, strict=True) if raw is None]
        if dead:
            await self._r.zrem(self._k.workers, *dead)
        return [json.loads(raw) for raw in raws if raw is not None]

    async def aclose(self) -> None:
        return None


__all__ = ["API_RETRIES", "LEASE_SECONDS", "WORKER_RETRIES", "RedisCoordination", "connect_redis"]
