"""The shared `RateWindows`: a hash per (team, route, window), taken by one script and expiring two windows
after it starts (see `gateway.store.rates`)."""

from __future__ import annotations

import math

import redis.asyncio as aioredis

from gateway.scheduling.pacing import Grant
from gateway.store.rates import DEFAULT_WINDOW_SECONDS, window_of
from gateway.store.redis.keys import Keys

# KEYS: the window's hash. ARGV: want, rpm ('' none), tpm ('' none), ttl (ms), estimate. Returns how many were
# granted: `grantable` of gateway.store.rates, in Lua.
_TAKE = """
local requests = tonumber(redis.call('HGET', KEYS[1], 'requests') or '0')
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '0')
local estimate = tonumber(ARGV[5])
local granted = tonumber(ARGV[1])
if ARGV[2] ~= '' then granted = math.max(0, math.min(granted, tonumber(ARGV[2]) - requests)) end
if ARGV[3] ~= '' then
  local tpm = tonumber(ARGV[3])
  if tokens >= tpm then return 0 end
  if estimate > 0 then granted = math.min(granted, math.max(1, math.floor((tpm - tokens) / estimate))) end
end
if granted > 0 then
  redis.call('HINCRBY', KEYS[1], 'requests', granted)
  if estimate > 0 then redis.call('HINCRBY', KEYS[1], 'tokens', granted * estimate) end
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return granted
"""


class RedisRates:
    def __init__(self, client: aioredis.Redis, keys: Keys, window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self._r, self._k = client, keys
        self.window_seconds = window_seconds
        self._ttl_ms = math.ceil(2 * window_seconds * 1000)
        self._take = client.register_script(_TAKE)

    async def take(self, team: str, route: str, want: int, rpm: int | None, tpm: int | None,
                   estimate: int = 0) -> Grant:
        window, left = window_of(self.window_seconds)
        args = [want, "" if rpm is None else rpm, "" if tpm is None else tpm, self._ttl_ms, estimate]
        granted = await self._take(keys=[self._k.rate(team, route, window)], args=args)
        return Grant(int(granted), left)

    async def add_tokens(self, team: str, route: str, tokens: int) -> None:
        if tokens:  # negative too: HINCRBY takes it
            key = self._k.rate(team, route, window_of(self.window_seconds)[0])
            async with self._r.pipeline(transaction=True) as tx:  # MULTI: the count and its expiry together
                tx.hincrby(key, "tokens", tokens)
                tx.pexpire(key, self._ttl_ms)
                await tx.execute()

    async def used(self, team: str, route: str) -> tuple[int, int]:
        values = await self._r.hmget(self._k.rate(team, route, window_of(self.window_seconds)[0]),
                                     ["requests", "tokens"])
        return int(values[0] or 0), int(values[1] or 0)


__all__ = ["RedisRates"]
