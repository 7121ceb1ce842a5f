"""The shared `Coordination`: leases and heartbeats in Redis.

- Leases: a key holding the holder's name, with a TTL renewed while held, so
  two processes never validate or finalize one batch at once, and one that
  dies mid-way leaves a lease that expires.
- Shared concurrency: `concurrency:{route}`, a background route's allowed concurrency and each worker's
  part (`gateway.store.redis.concurrency`).
- Heartbeats: `worker:{name}` with a TTL, and the `workers` zset of names. The
  Redis queue takes a shard over only from a consumer whose heartbeat is gone.
  The two are in different slots: a beat writes the heartbeat, then the name (a crash between: the next
  beat lists it); `gone` unlists the name, then drops the heartbeat; `live_workers` unlists a name whose
  heartbeat has expired.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, cast

import redis.asyncio as aioredis

from gateway.scheduling.busy_server import ShareAsk, ShareState
from gateway.store.leases import hold
from gateway.store.redis import concurrency
from gateway.store.redis.connection import get_many
from gateway.store.redis.keys import Keys

LEASE_SECONDS = 30.0

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RedisCoordination:
    def __init__(self, client: aioredis.Redis, keys: Keys, holder: str, ttl: float = LEASE_SECONDS) -> None:
        self._r, self._k, self.holder, self.ttl = client, keys, holder, ttl
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._exchange = client.register_script(concurrency.EXCHANGE)

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
        await self._r.set(self._k.worker(name), json.dumps(info), px=max(1, int(ttl * 1000)))
        await self._r.zadd(self._k.workers, {name: time.time()})

    async def gone(self, name: str) -> None:
        await self._r.zrem(self._k.workers, name)
        await self._r.delete(self._k.worker(name))

    async def live_workers(self) -> list[dict[str, Any]]:
        names = cast(list[str], await self._r.zrange(self._k.workers, 0, -1))
        if not names:
            return []
        raws = await get_many(self._r, [self._k.worker(n) for n in names])
        dead = [n for n, raw in zip(names, raws, strict=True) if raw is None]
        if dead:
            await self._r.zrem(self._k.workers, *dead)
        return [json.loads(raw) for raw in raws if raw is not None]

    # -- shared concurrency --------------------------------------------------------

    async def share_concurrency(self, ask: ShareAsk) -> ShareState:
        """A background route's turn (`gateway.scheduling.busy_server`), one Lua step: `store.redis.concurrency`."""
        raw = await self._exchange(keys=[self._k.concurrency(ask.route)], args=concurrency.arguments(ask))
        return concurrency.reply(raw)

    async def aclose(self) -> None:
        return None


__all__ = ["LEASE_SECONDS", "RedisCoordination"]
