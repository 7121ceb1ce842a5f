"""The shared `DashboardSessions` (`gateway.store.sessions`): a hash per session, keyed by the id's digest,
expiring by Redis' own TTL at the session's end."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from gateway.store.redis.connection import as_text
from gateway.store.redis.keys import Keys
from gateway.store.sessions import Session


class RedisDashboardSessions:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys

    async def open(self, name: str, session: Session) -> None:
        key = self._k.session(name)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"key_digest": session.key_digest, "expires_at": repr(session.expires_at)})
            pipe.pexpireat(key, max(1, int(session.expires_at * 1000)))
            await pipe.execute()

    async def get(self, name: str) -> Session | None:
        found = await self._r.hgetall(self._k.session(name))
        if not found:
            return None
        fields = {as_text(k): as_text(v) for k, v in found.items()}
        expires_at = float(fields.get("expires_at", 0))
        if "key_digest" not in fields or expires_at <= time.time():
            return None
        return Session(fields["key_digest"], expires_at)

    async def close(self, name: str) -> None:
        await self._r.delete(self._k.session(name))


__all__ = ["RedisDashboardSessions"]
