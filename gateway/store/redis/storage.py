"""The shared `StorageLedger` (`gateway.store.storage`): per team a hash of its counted files' bytes and one
of the pending entries' times, checked and written by one script in the team's slot.

A stale pending entry whose file record is gone was left by a crash and is dropped; the records are in their
own slots, so which are gone is read first and handed to the script, which drops each only if it is still
stale (an upload that renewed it since keeps it)."""

from __future__ import annotations

import time
from typing import cast

import redis.asyncio as aioredis

from gateway.store.redis.connection import get_many
from gateway.store.redis.keys import Keys
from gateway.store.storage import STALE_SECONDS

# KEYS: {t}:storage, {t}:storage-pending. ARGV: file id, size, limit, now, stale before, then the ids of stale
# pending entries whose file record is gone (left by a crash: dropped if still stale).
_RESERVE = """
for i = 6, #ARGV do
  local at = redis.call('HGET', KEYS[2], ARGV[i])
  if at and tonumber(at) < tonumber(ARGV[5]) then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
local sizes = redis.call('HGETALL', KEYS[1])
local used = 0
for i = 1, #sizes, 2 do
  if sizes[i] ~= ARGV[1] then used = used + tonumber(sizes[i + 1]) end
end
if used + tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return 1
"""

# KEYS: storage:{team}, storage-pending:{team}. ARGV: file id, now.
_HOLD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
"""


class RedisStorageLedger:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._reserve = client.register_script(_RESERVE)
        self._hold = client.register_script(_HOLD)

    async def reserve(self, team: str, file_id: str, size: int, limit: int) -> bool:
        t = time.time()
        pending = cast(dict[str, str], await self._r.hgetall(self._k.storage_pending(team)))
        stale = [i for i, at in pending.items() if float(at) < t - STALE_SECONDS]
        records = await get_many(self._r, [self._k.file(i) for i in stale])
        gone = [i for i, raw in zip(stale, records, strict=True) if raw is None]
        fits = await self._reserve(keys=[self._k.storage(team), self._k.storage_pending(team)],
                                   args=[file_id, size, limit, t, t - STALE_SECONDS, *gone])
        return bool(fits)

    async def settle(self, team: str, file_id: str, size: int) -> None:
        async with self._r.pipeline(transaction=True) as tx:
            tx.hset(self._k.storage(team), file_id, size)
            tx.hdel(self._k.storage_pending(team), file_id)
            await tx.execute()

    async def hold(self, team: str, file_id: str) -> None:
        await self._hold(keys=[self._k.storage(team), self._k.storage_pending(team)], args=[file_id, time.time()])

    async def release(self, team: str, file_id: str) -> None:
        async with self._r.pipeline(transaction=True) as tx:
            tx.hdel(self._k.storage(team), file_id)
            tx.hdel(self._k.storage_pending(team), file_id)
            await tx.execute()

    async def used(self, team: str) -> int:
        return sum(int(v) for v in await self._r.hvals(self._k.storage(team)))


__all__ = ["RedisStorageLedger"]
