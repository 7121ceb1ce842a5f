"""The shared `BackendState`: one JSON string per key in Redis (see `gateway.store.redis.store`)."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from gateway.store.redis.keys import Keys


class RedisBackendState:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys

    async def put(self, key: str, value: dict[str, Any]) -> None:
        await self._r.set(self._k.meta(key), json.dumps(value))

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = await self._r.get(self._k.meta(key))
        return json.loads(raw) if raw is not None else None

    async def delete(self, key: str) -> None:
        await self._r.delete(self._k.meta(key))


__all__ = ["RedisBackendState"]
