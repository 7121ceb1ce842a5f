"""The shared `Store`: records in Redis, for API replicas and workers on many machines.

It keeps the SQLite store's semantics exactly (see `gateway.store.sqlite_store`):

- A batch is one hash: every `BatchRecord` field JSON-encoded in its own
  field, plus integer counters (`n:completed`, `n:input_tokens`, …) that are
  the truth for `request_counts.completed/failed` and `usage`, as the SQLite
  columns are. `update_batch` is a Lua script: the `if_status` check and the
  write happen as one step, and no JSON is parsed inside Redis.
- `record_results` is a Lua script: HSETNX per line into the shard's journal
  hash, and the counters move only for lines not yet recorded, in the same step.
  One deliberate difference: after `drop_journal` (the shard is sealed) results
  for that shard are ignored, so a shard run twice (a worker taken for dead
  that was not) never counts a line twice.
- `finish_shard` is a Lua script over the shard hash and the set of finished
  indexes (SADD, then HLEN - SCARD).
- Lists follow SQLite's order: files by (created_at, id) either way from an
  `after` anchor, batches newest first by creation sequence.

Key names live in `gateway.store.keys`. Not for Redis Cluster: scripts touch a
batch's keys and the global indexes together.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any, cast

import redis.asyncio as aioredis

from gateway.json_codec import dumps, loads
from gateway.records import BatchStatus, Result, RouteStats, Shard, Usage
from gateway.store.base import BatchRecord, FileRecord, Page, RequestCounts
from gateway.store.keys import Keys

_COUNTERS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
_RECORD_FIELDS = tuple(f.name for f in dataclass_fields(BatchRecord))

_PUT_BATCH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('batch ' .. ARGV[1] .. ' exists') end
local seq = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'seq', seq, unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], seq, ARGV[1])
if ARGV[2] == '1' then redis.call('ZADD', KEYS[4], seq, ARGV[1]) end
return seq
"""

# ARGV: batch id, n (-1: no condition), n allowed statuses, mark ('finished'|'active'|''), field/value pairs
_UPDATE_BATCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local n = tonumber(ARGV[2])
local i = 3
if n >= 0 then
  local status = redis.call('HGET', KEYS[1], 'status')
  local ok = false
  for j = 3, n + 2 do if ARGV[j] == status then ok = true end end
  if not ok then return 0 end
  i = n + 3
end
local mark = ARGV[i]
if #ARGV > i then redis.call('HSET', KEYS[1], unpack(ARGV, i + 1)) end
if mark == 'finished' then
  redis.call('ZREM', KEYS[2], ARGV[1])
elseif mark == 'active' then
  redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[1], 'seq'), ARGV[1])
end
return 1
"""

_FINISH_SHARD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('SADD', KEYS[2], ARGV[1]) end
return redis.call('HLEN', KEYS[1]) - redis.call('SCARD', KEYS[2])
"""

# KEYS: journal, batch, sealed set, route stats. ARGV: shard index, route, then 8 values per result:
# line, json, ok (0/1), input, output, cached, reasoning tokens, cost (USD)
_RECORD_RESULTS = """
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 0 end
local c = {0, 0, 0, 0, 0, 0}
local cost = 0
for i = 3, #ARGV, 8 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    if ARGV[i + 2] == '1' then
      c[1] = c[1] + 1
      for k = 3, 6 do c[k] = c[k] + tonumber(ARGV[i + k]) end
    else
      c[2] = c[2] + 1
    end
    cost = cost + tonumber(ARGV[i + 7])
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
  end
end
return c[1] + c[2]
"""


def _encode(value: Any) -> str:
    return json.dumps(value.value if isinstance(value, BatchStatus) else value)


class RedisStore:
    def __init__(self, client: aioredis.Redis, keys: Keys | None = None, *, owns_client: bool = True) -> None:
        self._r = client
        self._k = keys or Keys()
        self._owns_client = owns_client
        self._put_batch = client.register_script(_PUT_BATCH)
        self._update_batch = client.register_script(_UPDATE_BATCH)
        self._finish_shard = client.register_script(_FINISH_SHARD)
        self._record_results = client.register_script(_RECORD_RESULTS)

    # -- files ---------------------------------------------------------------

    async def put_file(self, rec: FileRecord) -> None:
        old = await self.get_file(rec.id)
        async with self._r.pipeline(transaction=True) as tx:
            if old is not None and (old.owner, old.purpose) != (rec.owner, rec.purpose):
                tx.zrem(self._k.files(old.owner), old.id)
                tx.zrem(self._k.files(old.owner, old.purpose), old.id)
            tx.set(self._k.file(rec.id), json.dumps(rec.to_json()))
            tx.zadd(self._k.files(rec.owner), {rec.id: rec.created_at})
            tx.zadd(self._k.files(rec.owner, rec.purpose), {rec.id: rec.created_at})
            if rec.expires_at is not None:
                tx.zadd(self._k.file_expiry, {rec.id: rec.expires_at})
            else:
                tx.zrem(self._k.file_expiry, rec.id)
            await tx.execute()

    async def get_file(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        raw = await self._r.get(self._k.file(file_id))
        if raw is None:
            return None
        rec = FileRecord.from_json(json.loads(raw))
        return None if owner is not None and rec.owner != owner else rec

    async def list_files(
        self, owner: str, *, purpose: str | None, limit: int, order: str, after: str | None
    ) -> Page:
        index = self._k.files(owner, purpose)
        asc = order == "asc"
        anchor = await self.get_file(after, owner) if after else None
        if anchor is None:
            start = 0
        else:
            # Where (created_at, after) falls in the index: members with a lower score,
            # plus those with the same score and a lower id (Redis orders ties by member).
            async with self._r.pipeline(transaction=True) as tx:
                tx.zcount(index, "-inf", f"({anchor.created_at}")
                tx.zrangebyscore(index, anchor.created_at, anchor.created_at)
                tx.zcard(index)
                less, same, card = await tx.execute()
            if asc:
                start = less + sum(1 for m in same if m <= after)
            else:
                start = card - (less + sum(1 for m in same if m < after))
        ids = await (self._r.zrange if asc else self._r.zrevrange)(index, start, start + limit)
        data = await self._files(cast(list[str], ids))
        return Page(data=data[:limit], has_more=len(data) > limit)

    async def _files(self, ids: Sequence[str]) -> list[FileRecord]:
        if not ids:
            return []
        raws = await self._r.mget([self._k.file(i) for i in ids])
        return [FileRecord.from_json(json.loads(raw)) for raw in raws if raw is not None]

    async def delete_file(self, file_id: str, owner: str | None = None) -> bool:
        rec = await self.get_file(file_id, owner)
        if rec is None:
            return False
        async with self._r.pipeline(transaction=True) as tx:
            tx.delete(self._k.file(file_id))
            tx.zrem(self._k.files(rec.owner), file_id)
            tx.zrem(self._k.files(rec.owner, rec.purpose), file_id)
            tx.zrem(self._k.file_expiry, file_id)
            deleted, *_ = await tx.execute()
        return bool(deleted)

    async def expired_files(self, at: int, limit: int = 100) -> list[FileRecord]:
        ids = await self._r.zrangebyscore(self._k.file_expiry, "-inf", f"({at}", start=0, num=limit)
        return await self._files(cast(list[str], ids))

    # -- batches -------------------------------------------------------------

    async def put_batch(self, rec: BatchRecord) -> None:
        data = rec.to_json()
        pairs: list[str | int] = []
        for name in _RECORD_FIELDS:
            pairs += [name, _encode(data[name])]
        for name in _COUNTERS:  # like SQLite's columns: counting starts at zero
            pairs += [f"n:{name}", 0]
        active = "0" if rec.status.finished else "1"
        keys = [self._k.batch(rec.id), self._k.batches(rec.owner), self._k.batch_seq, self._k.active]
        await self._put_batch(keys=keys, args=[rec.id, active, *pairs])

    @staticmethod
    def _decode_batch(raw: dict[str, str]) -> BatchRecord:
        data = {name: json.loads(raw[name]) for name in _RECORD_FIELDS if name in raw}
        n = {name: int(raw.get(f"n:{name}", 0)) for name in _COUNTERS}
        rec = BatchRecord.from_json(data)
        rec.counts = RequestCounts(total=rec.counts.total, completed=n["completed"], failed=n["failed"])
        rec.usage = Usage(input_tokens=n["input_tokens"], output_tokens=n["output_tokens"],
                          cached_tokens=n["cached_tokens"], reasoning_tokens=n["reasoning_tokens"])
        return rec

    async def get_batch(self, batch_id: str, owner: str | None = None) -> BatchRecord | None:
        raw = await self._r.hgetall(self._k.batch(batch_id))
        if not raw:
            return None
        rec = self._decode_batch(cast(dict[str, str], raw))
        return None if owner is not None and rec.owner != owner else rec

    async def _batches(self, ids: Sequence[str]) -> list[BatchRecord]:
        if not ids:
            return []
        async with self._r.pipeline(transaction=False) as p:
            for batch_id in ids:
                p.hgetall(self._k.batch(batch_id))
            raws = await p.execute()
        return [self._decode_batch(raw) for raw in raws if raw]

    async def list_batches(self, owner: str, *, limit: int, after: str | None) -> Page:
        index = self._k.batches(owner)
        anchor = await self._r.zscore(index, after) if after else None
        if anchor is None:
            ids = await self._r.zrevrange(index, 0, limit)
        else:
            ids = await self._r.zrevrangebyscore(index, f"({int(anchor)}", "-inf", start=0, num=limit + 1)
        data = await self._batches(cast(list[str], ids))
        return Page(data=data[:limit], has_more=len(data) > limit)

    async def update_batch(
        self, batch_id: str, fields: dict[str, Any], *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        args: list[str] = [batch_id]
        if if_status is None:
            args.append("-1")
        else:
            args += [str(len(if_status)), *(_encode(s) for s in if_status)]
        status = fields.get("status")
        if status is None:
            args.append("")
        else:
            args.append("finished" if BatchStatus(status).finished else "active")
        for name, value in fields.items():
            args += [name, _encode(value)]
        applied = await self._update_batch(keys=[self._k.batch(batch_id), self._k.active], args=args)
        return bool(applied)

    async def active_batches(self) -> list[BatchRecord]:
        ids = await self._r.zrange(self._k.active, 0, -1)
        return [b for b in await self._batches(cast(list[str], ids)) if not b.status.finished]

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

    async def finish_shard(self, shard: Shard) -> int:
        keys = [self._k.shards(shard.batch_id), self._k.shards_done(shard.batch_id)]
        return int(await self._finish_shard(keys=keys, args=[str(shard.index)]))

    # -- journal -------------------------------------------------------------

    async def record_results(self, shard: Shard, results: Sequence[Result]) -> None:
        if not results:
            return
        args: list[str | int | float] = [shard.index, shard.route]
        for r in results:
            u = r.usage
            args += [r.line, dumps(r.to_json()).decode(), 1 if r.ok else 0,
                     u.input_tokens, u.output_tokens, u.cached_tokens, u.reasoning_tokens, r.cost_usd or 0]
        keys = [self._k.journal(shard.batch_id, shard.index), self._k.batch(shard.batch_id),
                self._k.sealed(shard.batch_id), self._k.route_stats(shard.batch_id)]
        await self._record_results(keys=keys, args=args)

    async def journal(self, shard: Shard) -> list[Result]:
        raws = await self._r.hvals(self._k.journal(shard.batch_id, shard.index))
        return [Result.from_json(loads(raw)) for raw in raws]

    async def recorded_lines(self, shard: Shard) -> set[int]:
        return {int(line) for line in await self._r.hkeys(self._k.journal(shard.batch_id, shard.index))}

    async def drop_journal(self, shard: Shard) -> None:
        # The shard is sealed: a result that comes later (the same shard run twice, by a worker
        # taken for dead) must not count again, though no journal is left to dedupe it.
        async with self._r.pipeline(transaction=True) as tx:
            tx.delete(self._k.journal(shard.batch_id, shard.index))
            tx.sadd(self._k.sealed(shard.batch_id), shard.index)
            await tx.execute()

    async def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        raw = cast(dict[str, str], await self._r.hgetall(self._k.route_stats(batch_id)))
        stats: dict[str, RouteStats] = {}
        for name, value in raw.items():
            route, _, field_ = name.rpartition(":")
            entry = stats.setdefault(route, RouteStats())
            setattr(entry, field_, float(value) if field_ == "cost_usd" else int(value))
        return stats

    # -- backend state -------------------------------------------------------

    async def put_meta(self, key: str, value: dict[str, Any]) -> None:
        await self._r.set(self._k.meta(key), json.dumps(value))

    async def get_meta(self, key: str) -> dict[str, Any] | None:
        raw = await self._r.get(self._k.meta(key))
        return json.loads(raw) if raw is not None else None

    async def delete_meta(self, key: str) -> None:
        await self._r.delete(self._k.meta(key))

    async def aclose(self) -> None:
        if self._owns_client:
            await self._r.aclose()


__all__ = ["RedisStore"]
