"""The shared `QuotaLedger`: per team a hash of its admitted batches, checked and written by one script."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import cast

import redis.asyncio as aioredis

from gateway.store.keys import Keys
from gateway.store.quota import MAX_ACTIVE_BATCHES, MAX_ENQUEUED_REQUESTS, TeamLimits, TeamUsage

# KEYS: quota:{team}, quota-at, quota-team. ARGV: batch, requests, max batches ('' none), max requests, now, team.
_ADMIT = f"""
local n = redis.call('HLEN', KEYS[1])
if ARGV[3] ~= '' and n + 1 > tonumber(ARGV[3]) then return '{MAX_ACTIVE_BATCHES}' end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
if ARGV[4] ~= '' and total + tonumber(ARGV[2]) > tonumber(ARGV[4]) then return '{MAX_ENQUEUED_REQUESTS}' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
return false
"""


class RedisQuotaLedger:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._admit = client.register_script(_ADMIT)

    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits) -> str | None:
        k = self._k
        args: list[str | int | float] = [
            batch_id, requests, "" if limits.max_active_batches is None else limits.max_active_batches,
            "" if limits.max_enqueued_requests is None else limits.max_enqueued_requests, time.time(), team]
        refused = await self._admit(keys=[k.quota(team), k.quota_admitted_at, k.quota_team], args=args)
        return str(refused) if refused else None

    async def usage(self, team: str) -> TeamUsage:
        values = await self._r.hvals(self._k.quota(team))
        return TeamUsage(len(values), sum(int(v) for v in values))

    async def admitted(self) -> dict[str, float]:
        pairs = cast(list[tuple[str, float]],
                     await self._r.zrange(self._k.quota_admitted_at, 0, -1, withscores=True))
        return {str(b): float(at) for b, at in pairs}

    async def release(self, batch_ids: Collection[str]) -> None:
        k = self._k
        for batch_id in batch_ids:
            team = await self._r.hget(k.quota_team, batch_id)
            async with self._r.pipeline(transaction=True) as tx:
                if team is not None:
                    tx.hdel(k.quota(str(team)), batch_id)
                tx.zrem(k.quota_admitted_at, batch_id)
                tx.hdel(k.quota_team, batch_id)
                await tx.execute()

    async def add_spend(self, team: str, period: int, usd: float) -> None:
        await self._r.hincrbyfloat(self._k.spend(team), str(period), usd)  # atomic in Redis

    async def spend(self, team: str, period: int) -> float:
        value = await self._r.hget(self._k.spend(team), str(period))
        return float(value) if value is not None else 0.0

    async def aclose(self) -> None:
        return None  # the client is the store's


__all__ = ["RedisQuotaLedger"]
