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

    async def scan(self, prefix: str) -> dict[str, dict[str, Any]]:
        start = len(self._k.meta(""))
        found: dict[str, dict[str, Any]] = {}
        async for raw_key in self._r.scan_iter(match=_glob_escaped(self._k.meta(prefix)) + "*", count=500):
            name = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            raw = await self._r.get(name)
            if raw is not None:  # deleted between the scan and the read
                found[name[start:]] = json.loads(raw)
        return found


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


__all__ = ["RedisBackendState"]
