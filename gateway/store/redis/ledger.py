"""The shared `ShardLedger`: shards, attempts, the result journal and route stats in Redis
(see `gateway.store.redis.store`).

- `record_results` is a Lua script: one entry per new line into the shard's journal
  hash (and, numbered, into the batch's result log stream), and the batch's counters
  (in its hash, see `gateway.store.redis.batches`)
  and route stats (and what the batch owes its team's spend, `{b}:spend-owed`) move only for
  lines not yet recorded, in the same step, all in the batch's slot; the team's spend follows in a
  second step in the team's slot (`gateway.store.redis.spend`), only when the new lines cost something.
  One deliberate difference from SQLite: after `drop_journal` (the shard is
  sealed) results for that shard are ignored, so a shard run twice (a worker
  taken for dead that was not) never counts a line twice.
- `finish_shard` is a Lua script over the shard hash and the set of finished
  indexes (SADD, then HLEN - SCARD).
- `drop_journal` is a Lua script: the shard's journal and its entries of the result log go, and its span of
  seqs is kept (`sealed_seqs`): the log holds the unsealed shards' results only, never a whole batch's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

import redis.asyncio as aioredis

from gateway.domain import Result, RouteStats, Shard, billable
from gateway.json_codec import dumps, loads
from gateway.store.quota import SpendTo
from gateway.store.redis.keys import Keys
from gateway.store.redis.spend import SpendMover, owed_field

# One attempt taken back, never below 0 (HINCRBY alone could go negative).
_RETURN_ATTEMPT = """
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if n > 0 then n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1) end
return n
"""

_FINISH_SHARD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('SADD', KEYS[2], ARGV[1]) end
return redis.call('HLEN', KEYS[1]) - redis.call('SCARD', KEYS[2])
"""

_LAST_SEQ = """
-- The log's last seq where its counter is missing (a log begun before the counter, or a counter lost): the
-- stream's last generated id, which its entries leaving it do not lower (its length does).
local function last_seq(stream)
  if redis.call('EXISTS', stream) == 0 then return 0 end
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return tonumber(string.match(info[i + 1], '%-(%d+)$')) end
  end
  return redis.call('XLEN', stream)
end
"""

# KEYS: journal, batch, sealed set, route stats, the batch's result log, its spend owed, the log's last seq
# (one batch's slot).
# ARGV: shard index, route, the owed field (`{team}:{period}`; '': no spend), then 10 values per result: line,
# json, ok (0/1), input, output, cached, reasoning tokens, cost (USD; only a positive one counts: the spend
# never falls within its period), re-runs, output_invalid (0/1). Returns the lines counted, and the owed
# field's new total when it moved.
_RECORD_RESULTS = _LAST_SEQ + """
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return {0, false} end
if redis.call('EXISTS', KEYS[7]) == 0 then redis.call('SET', KEYS[7], last_seq(KEYS[5])) end
local c = {0, 0, 0, 0, 0, 0}
local cost, reruns, invalid = 0, 0, 0
for i = 4, #ARGV, 10 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    -- The next seq (its own counter: a sealed shard's entries leave the log), spliced into the JSON's front.
    local seq = redis.call('INCR', KEYS[7])
    local data = '{"seq":' .. seq .. ',' .. string.sub(ARGV[i + 1], 2)
    redis.call('HSET', KEYS[1], ARGV[i], data)
    redis.call('XADD', KEYS[5], '0-' .. seq, 'r', data)
    if ARGV[i + 2] == '1' then
      c[1] = c[1] + 1
      for k = 3, 6 do c[k] = c[k] + tonumber(ARGV[i + k]) end
    else
      c[2] = c[2] + 1
    end
    local usd = tonumber(ARGV[i + 7]) or 0
    if usd > 0 and usd < math.huge then cost = cost + usd end
    reruns = reruns + tonumber(ARGV[i + 8])
    invalid = invalid + tonumber(ARGV[i + 9])
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local names = {'n:completed', 'n:failed', 'n:input_tokens', 'n:output_tokens', 'n:cached_tokens',
                 'n:reasoning_tokens'}
  for k = 1, 6 do if c[k] ~= 0 then redis.call('HINCRBY', KEYS[2], names[k], c[k]) end end
  if c[1] + c[2] > 0 then
    local r = ARGV[2] .. ':'
    redis.call('HINCRBY', KEYS[4], r .. 'completed', c[1])
    redis.call('HINCRBY', KEYS[4], r .. 'failed', c[2])
    redis.call('HINCRBY', KEYS[4], r .. 'input_tokens', c[3])
    redis.call('HINCRBY', KEYS[4], r .. 'output_tokens', c[4])
    if cost ~= 0 then redis.call('HINCRBYFLOAT', KEYS[4], r .. 'cost_usd', cost) end
    if reruns ~= 0 then redis.call('HINCRBY', KEYS[4], r .. 'reruns', reruns) end
    if invalid ~= 0 then redis.call('HINCRBY', KEYS[4], r .. 'output_invalid', invalid) end
  end
end
if ARGV[3] ~= '' and cost ~= 0 then
  return {c[1] + c[2], redis.call('HINCRBYFLOAT', KEYS[6], ARGV[3], cost)}
end
return {c[1] + c[2], false}
"""

# KEYS: journal, sealed set, the batch's result log, its sealed shards' spans, the log's last seq. ARGV: shard
# index. The shard's results leave the log (they are in its results blob now, with their seq); its span of
# seqs ("first last") says where to find them.
_DROP_JOURNAL = _LAST_SEQ + """
if redis.call('EXISTS', KEYS[5]) == 0 then redis.call('SET', KEYS[5], last_seq(KEYS[3])) end
local first, last
for _, data in ipairs(redis.call('HVALS', KEYS[1])) do
  local seq = tonumber(string.match(data, '^{"seq":(%d+),'))
  if seq then
    redis.call('XDEL', KEYS[3], '0-' .. seq)
    if first == nil or seq < first then first = seq end
    if last == nil or seq > last then last = seq end
  end
end
if first then redis.call('HSETNX', KEYS[4], ARGV[1], first .. ' ' .. last) end
redis.call('DEL', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""

# KEYS: batch, sealed set, route stats. ARGV: shard index, route, count. Sealing the shard makes it once only.
_RECORD_ANSWERED = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'n:failed', ARGV[3])
  local r = ARGV[2] .. ':'
  redis.call('HINCRBY', KEYS[3], r .. 'completed', 0)
  redis.call('HINCRBY', KEYS[3], r .. 'failed', ARGV[3])
  redis.call('HINCRBY', KEYS[3], r .. 'input_tokens', 0)
  redis.call('HINCRBY', KEYS[3], r .. 'output_tokens', 0)
end
return 1
"""


class RedisLedger:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._finish_shard = client.register_script(_FINISH_SHARD)
        self._return_attempt = client.register_script(_RETURN_ATTEMPT)
        self._record_results = client.register_script(_RECORD_RESULTS)
        self._record_answered = client.register_script(_RECORD_ANSWERED)
        self._drop_journal = client.register_script(_DROP_JOURNAL)
        self._spend = SpendMover(client, keys)

    # -- shards --------------------------------------------------------------

    async def put_shards(self, batch_id: str, shards: Sequence[Shard]) -> None:
        if not shards:
            return
        async with self._r.pipeline(transaction=True) as tx:
            for s in shards:
                tx.hsetnx(self._k.shards(batch_id), str(s.index), json.dumps({"route": s.route, "size": s.size}))
            await tx.execute()

    async def _shard_table(self, batch_id: str) -> tuple[list[Shard], set[str]]:
        async with self._r.pipeline(transaction=True) as tx:
            tx.hgetall(self._k.shards(batch_id))
            tx.smembers(self._k.shards_done(batch_id))
            table, done = await tx.execute()
        shards = []
        for index, raw in table.items():
            info = json.loads(raw)
            shards.append(Shard(batch_id, int(index), info["route"], info["size"]))
        shards.sort(key=lambda s: s.index)
        return shards, set(done)

    async def get_shards(self, batch_id: str) -> list[Shard]:
        return (await self._shard_table(batch_id))[0]

    async def unfinished_shards(self, batch_id: str) -> list[Shard]:
        shards, done = await self._shard_table(batch_id)
        return [s for s in shards if str(s.index) not in done]

    async def begin_attempt(self, shard: Shard) -> int:
        return int(await self._r.hincrby(self._k.attempts(shard.batch_id), str(shard.index), 1))

    async def return_attempt(self, shard: Shard) -> int:
        return int(await self._return_attempt(keys=[self._k.attempts(shard.batch_id)], args=[str(shard.index)]))

    async def finish_shard(self, shard: Shard) -> int:
        keys = [self._k.shards(shard.batch_id), self._k.shards_done(shard.batch_id)]
        return int(await self._finish_shard(keys=keys, args=[str(shard.index)]))

    # -- journal -------------------------------------------------------------

    async def record_results(self, shard: Shard, results: Sequence[Result], spend: SpendTo | None = None) -> None:
        if not results:
            return
        owed = "" if spend is None else owed_field(spend.team, spend.period)
        args: list[str | int | float] = [shard.index, shard.route, owed]
        for r in results:
            u = r.usage
            row = r.to_json()
            row.pop("seq", None)  # the script numbers it
            args += [r.line, dumps(row).decode(), 1 if r.ok else 0, u.input_tokens, u.output_tokens,
                     u.cached_tokens, u.reasoning_tokens, billable(r.cost_usd), r.reruns, 1 if r.output_invalid else 0]
        b = shard.batch_id
        keys = [self._k.journal(b, shard.index), self._k.batch(b), self._k.sealed(b), self._k.route_stats(b),
                self._k.results_log(b), self._k.spend_owed(b), self._k.results_seq(b)]
        _, total = await self._record_results(keys=keys, args=args)
        if spend is not None and total:  # the cost moved: the team's spend follows (gateway.store.redis.spend)
            await self._spend.move(b, spend.team, {str(spend.period): str(total)})

    async def record_answered(self, shard: Shard, count: int) -> None:
        if count <= 0:
            return
        keys = [self._k.batch(shard.batch_id), self._k.sealed(shard.batch_id), self._k.route_stats(shard.batch_id)]
        await self._record_answered(keys=keys, args=[shard.index, shard.route, count])

    async def journal(self, shard: Shard) -> list[Result]:
        raws = await self._r.hvals(self._k.journal(shard.batch_id, shard.index))
        return [Result.from_json(loads(raw)) for raw in raws]

    async def recorded_lines(self, shard: Shard) -> set[int]:
        return {int(line) for line in await self._r.hkeys(self._k.journal(shard.batch_id, shard.index))}

    async def drop_journal(self, shard: Shard) -> None:
        # The shard is sealed: a result that comes later (the same shard run twice, by a worker
        # taken for dead) must not count again, though no journal is left to dedupe it.
        b = shard.batch_id
        keys = [self._k.journal(b, shard.index), self._k.sealed(b), self._k.results_log(b), self._k.sealed_seqs(b),
                self._k.results_seq(b)]
        await self._drop_journal(keys=keys, args=[shard.index])

    async def logged(self, batch_id: str, after: int, limit: int) -> list[Result]:
        entries = cast(list[tuple[str, dict[str, str]]],
                       await self._r.xrange(self._k.results_log(batch_id), min=f"0-{after + 1}", count=limit))
        return [Result.from_json(loads(fields["r"])) for _, fields in entries]

    async def sealed_seqs(self, batch_id: str) -> dict[int, tuple[int, int]]:
        raw = cast(dict[str, str], await self._r.hgetall(self._k.sealed_seqs(batch_id)))
        spans: dict[int, tuple[int, int]] = {}
        for index, span in raw.items():
            first, last = span.split()
            spans[int(index)] = (int(first), int(last))
        return spans

    async def settle_spend(self, batch_id: str) -> None:
        await self._spend.settle(batch_id)

    async def drop_log(self, batch_id: str) -> None:
        await self._r.delete(self._k.results_log(batch_id), self._k.results_seq(batch_id),
                             self._k.sealed_seqs(batch_id))

    async def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        raw = cast(dict[str, str], await self._r.hgetall(self._k.route_stats(batch_id)))
        stats: dict[str, RouteStats] = {}
        for name, value in raw.items():
            route, _, field_ = name.rpartition(":")
            entry = stats.setdefault(route, RouteStats())
            setattr(entry, field_, float(value) if field_ == "cost_usd" else int(value))
        return stats


__all__ = ["RedisLedger"]
