"""The shared `QuotaLedger`: per team a hash of its admitted batches (and one of their requests per model),
checked and written by one script in the team's slot, so two replicas never both pass the last free place.
`{t}:spend` is written by `gateway.store.redis.spend` (from the batch's `spend-owed`, see there); `{t}:reserved`
(holder -> USD) is what is held of it, reserved by one script that reads the spend beside it (same slot).

The global index of admissions (`quota-at`, `quota-team`: what the sweep walks to let go of finished
batches) is in other slots, so it is written around the script, in an order safe to stop after: the index
FIRST, then the admission (a crash leaves an index entry for no admission: the sweep lets it go after
`GRACE_SECONDS`, as it does an admission whose batch was never stored); on release the team's hashes first,
then the index (a crash leaves an entry the next sweep releases again, which is idempotent). An admission
therefore never exists outside the index, and is never stuck counting against its team."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import cast

import redis.asyncio as aioredis

from gateway.store.quota import (
    MAX_ACTIVE_BATCHES,
    MAX_ENQUEUED_REQUESTS,
    MODEL_MAX_ENQUEUED_REQUESTS,
    RESERVE_SLACK,
    TeamLimits,
    TeamUsage,
)
from gateway.store.redis.keys import Keys

# KEYS: {t}:quota, {t}:quota-models (one team's slot).
# ARGV: batch, requests, max batches ('' none), max requests, the batch's {model: requests} JSON,
# the per-model limits {model: limit} JSON.
_ADMIT = f"""
local n = redis.call('HLEN', KEYS[1])
if ARGV[3] ~= '' and n + 1 > tonumber(ARGV[3]) then return '{MAX_ACTIVE_BATCHES}' end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
if ARGV[4] ~= '' and total + tonumber(ARGV[2]) > tonumber(ARGV[4]) then return '{MAX_ENQUEUED_REQUESTS}' end
local mine, limits = cjson.decode(ARGV[5]), cjson.decode(ARGV[6])
if next(limits) ~= nil and next(mine) ~= nil then
  local used = {{}}
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    for model, count in pairs(cjson.decode(v)) do used[model] = (used[model] or 0) + count end
  end
  for model, limit in pairs(limits) do
    local add = mine[model] or 0
    if add > 0 and (used[model] or 0) + add > limit then return '{MODEL_MAX_ENQUEUED_REQUESTS}' end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if next(mine) ~= nil then redis.call('HSET', KEYS[2], ARGV[1], ARGV[5]) end
return false
"""

# KEYS: {t}:spend, {t}:reserved (one team's slot). ARGV: budget period, limit (USD), holder, then each line's cost.
# `gateway.store.quota.fitting` in Lua: the longest prefix of the costs that fits the limit less the spend and the
# other holders' holds; the holder holds their total (nothing, when none fits). Returns how many fit.
_RESERVE = f"""
local room = tonumber(ARGV[2]) - tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  if held[i] ~= ARGV[3] then room = room - tonumber(held[i + 1]) end
end
local count, total = 0, 0
for i = 4, #ARGV do
  local cost = tonumber(ARGV[i])
  if total + cost > room + {RESERVE_SLACK!r} then break end
  total = total + cost
  count = count + 1
end
if count > 0 then
  redis.call('HSET', KEYS[2], ARGV[3], string.format('%.17g', total))
else
  redis.call('HDEL', KEYS[2], ARGV[3])
end
return count
"""

# KEYS: {t}:reserved. ARGV: a holder, USD. The hold less the USD, never below nothing (a hold gone stays gone).
_SHRINK = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local left = tonumber(held) - tonumber(ARGV[2])
if left < 0 then left = 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.17g', left))
return 1
"""

# KEYS: {t}:reserved. ARGV: a holder prefix. Every hold whose holder starts with it goes.
_UNRESERVE = """
local gone = 0
for _, holder in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(holder, 1, #ARGV[1]) == ARGV[1] then gone = gone + redis.call('HDEL', KEYS[1], holder) end
end
return gone
"""


class RedisQuotaLedger:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._admit = client.register_script(_ADMIT)
        self._reserve = client.register_script(_RESERVE)
        self._unreserve = client.register_script(_UNRESERVE)
        self._shrink = client.register_script(_SHRINK)

    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits,
                    by_model: Mapping[str, int] | None = None) -> str | None:
        k = self._k
        args: list[str | int | float] = [
            batch_id, requests, "" if limits.max_active_batches is None else limits.max_active_batches,
            "" if limits.max_enqueued_requests is None else limits.max_enqueued_requests,
            json.dumps(dict(by_model or {})), json.dumps(dict(limits.model_max_enqueued_requests))]
        async with self._r.pipeline(transaction=False) as p:  # the index first (see the module's docstring)
            p.zadd(k.quota_admitted_at, {batch_id: time.time()}, nx=True)
            p.hset(k.quota_team, batch_id, team)
            new, _ = await p.execute()
        refused = await self._admit(keys=[k.quota(team), k.quota_models(team)], args=args)
        if refused and new:  # nothing was admitted under this id: its index entry goes again
            async with self._r.pipeline(transaction=False) as p:
                p.hdel(k.quota_team, batch_id)
                p.zrem(k.quota_admitted_at, batch_id)
                await p.execute()
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
            if team is not None:  # the team's hashes first, then the index (see the module's docstring)
                async with self._r.pipeline(transaction=True) as tx:
                    tx.hdel(k.quota(str(team)), batch_id)
                    tx.hdel(k.quota_models(str(team)), batch_id)
                    await tx.execute()
            await self._r.hdel(k.quota_team, batch_id)
            await self._r.zrem(k.quota_admitted_at, batch_id)

    async def spend(self, team: str, period: int) -> float:
        value = await self._r.hget(self._k.spend(team), str(period))
        return float(value) if value is not None else 0.0

    async def reserve(self, team: str, period: int, holder: str, costs: Sequence[float], limit: float) -> int:
        args: list[str | int | float] = [str(period), repr(float(limit)), holder, *(repr(float(c)) for c in costs)]
        return int(await self._reserve(keys=[self._k.spend(team), self._k.reserved(team)], args=args))

    async def shrink(self, team: str, holder: str, usd: float) -> None:
        await self._shrink(keys=[self._k.reserved(team)], args=[holder, repr(float(usd))])

    async def unreserve(self, team: str, prefix: str) -> None:
        await self._unreserve(keys=[self._k.reserved(team)], args=[prefix])

    async def reserved(self, team: str) -> dict[str, float]:
        held = cast(dict[str, str], await self._r.hgetall(self._k.reserved(team)))
        return {str(h): float(u) for h, u in held.items()}


__all__ = ["RedisQuotaLedger"]
