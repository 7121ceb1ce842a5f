"""The shared `QuotaLedger`: per team a hash of its admitted batches (and one of their requests per model),
checked and written by one script. `spend:{team}` is written by `RedisLedger.record_results`, in the
script that journals the results."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import cast

import redis.asyncio as aioredis

from gateway.store.quota import (
    MAX_ACTIVE_BATCHES,
    MAX_ENQUEUED_REQUESTS,
    MODEL_MAX_ENQUEUED_REQUESTS,
    TeamLimits,
    TeamUsage,
)
from gateway.store.redis.keys import Keys

# KEYS: quota:{team}, quota-at, quota-team, quota-models:{team}.
# ARGV: batch, requests, max batches ('' none), max requests, now, team, the batch's {model: requests} JSON,
# the per-model limits {model: limit} JSON.
_ADMIT = f"""
local n = redis.call('HLEN', KEYS[1])
if ARGV[3] ~= '' and n + 1 > tonumber(ARGV[3]) then return '{MAX_ACTIVE_BATCHES}' end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
if ARGV[4] ~= '' and total + tonumber(ARGV[2]) > tonumber(ARGV[4]) then return '{MAX_ENQUEUED_REQUESTS}' end
local mine, limits = cjson.decode(ARGV[7]), cjson.decode(ARGV[8])
if next(limits) ~= nil and next(mine) ~= nil then
  local used = {{}}
  for _, v in ipairs(redis.call('HVALS', KEYS[4])) do
    for model, count in pairs(cjson.decode(v)) do used[model] = (used[model] or 0) + count end
  end
  for model, limit in pairs(limits) do
    local add = mine[model] or 0
    if add > 0 and (used[model] or 0) + add > limit then return '{MODEL_MAX_ENQUEUED_REQUESTS}' end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if next(mine) ~= nil then redis.call('HSET', KEYS[4], ARGV[1], ARGV[7]) end
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
return false
"""


class RedisQuotaLedger:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._admit = client.register_script(_ADMIT)

    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits,
                    by_model: Mapping[str, int] | None = None) -> str | None:
        k = self._k
        args: list[str | int | float] = [
            batch_id, requests, "" if limits.max_active_batches is None else limits.max_active_batches,
            "" if limits.max_enqueued_requests is None else limits.max_enqueued_requests, time.time(), team,
            json.dumps(dict(by_model or {})), json.dumps(dict(limits.model_max_enqueued_requests))]
        refused = await self._admit(keys=[k.quota(team), k.quota_admitted_at, k.quota_team, k.quota_models(team)],
                                    args=args)
        return str(refused) if refused else None

    async def usage(self, team: str) -> TeamUsage:
        async with self._r.pipeline(transaction=True) as tx:
            tx.hvals(self._k.quota(team))
            tx.hvals(self._k.quota_models(team))
            values, models = await tx.execute()
        by_model: dict[str, int] = {}
        for raw in models:
            for model, count in json.loads(raw).items():
                by_model[model] = by_model.get(model, 0) + int(count)
        return TeamUsage(len(values), sum(int(v) for v in values), by_model)

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
                    tx.hdel(k.quota_models(str(team)), batch_id)
                tx.zrem(k.quota_admitted_at, batch_id)
                tx.hdel(k.quota_team, batch_id)
                await tx.execute()

    async def spend(self, team: str, period: int) -> float:
        value = await self._r.hget(self._k.spend(team), str(period))
        return float(value) if value is not None else 0.0


__all__ = ["RedisQuotaLedger"]
