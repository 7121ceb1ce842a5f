"""The shared `IdempotencyKeys` (`gateway.store.idempotency`): a hash per team and key, reserved, completed and
released by scripts (each one atomic step), expiring by Redis' own TTL."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from gateway.store.idempotency import KEY_TTL_SECONDS, IdempotencyEntry
from gateway.store.redis.connection import as_text
from gateway.store.redis.keys import Keys

# KEYS: idempotency:{team}:{key}. ARGV: token, fingerprint, now, hold (ms). 0 when reserved, else the live entry.
_RESERVE = """
local found = redis.call('HGETALL', KEYS[1])
if #found > 0 then return found end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fingerprint', ARGV[2], 'created_at', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 0
"""

# KEYS: the same. ARGV: token, fingerprint, result JSON, the created_at + 24 h (ms since the epoch).
_COMPLETE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'result') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return 1
"""

# KEYS: the same. ARGV: token.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] and redis.call('HEXISTS', KEYS[1], 'result') == 0 then
  redis.call('DEL', KEYS[1])
end
"""


class RedisIdempotencyKeys:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._reserve = client.register_script(_RESERVE)
        self._complete = client.register_script(_COMPLETE)
        self._release = client.register_script(_RELEASE)

    async def reserve(self, team: str, key: str, token: str, fingerprint: str, hold: float) -> IdempotencyEntry | None:
        found = await self._reserve(keys=[self._k.idempotency(team, key)],
                                    args=[token, fingerprint, repr(time.time()), max(1, int(hold * 1000))])
        if not isinstance(found, list):
            return None
        fields = {as_text(found[i]): as_text(found[i + 1]) for i in range(0, len(found), 2)}
        result = json.loads(fields["result"]) if "result" in fields else None
        return IdempotencyEntry(fields["token"], fields["fingerprint"], float(fields["created_at"]), result)

    async def complete(self, team: str, key: str, token: str, fingerprint: str, result: dict[str, Any]) -> bool:
        name = self._k.idempotency(team, key)
        created = await self._r.hget(name, "created_at")  # a lapsed reservation has none: the script refuses
        until_ms = int((float(created or time.time()) + KEY_TTL_SECONDS) * 1000)
        return bool(await self._complete(keys=[name], args=[token, fingerprint, json.dumps(result), until_ms]))

    async def release(self, team: str, key: str, token: str) -> None:
        await self._release(keys=[self._k.idempotency(team, key)], args=[token])


__all__ = ["RedisIdempotencyKeys"]
