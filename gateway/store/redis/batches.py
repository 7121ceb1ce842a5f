"""The shared `BatchStore`: batch records in Redis (see `gateway.store.redis.store`).

A batch is one hash: every `BatchRecord` field JSON-encoded in its own field,
plus integer counters (`n:completed`, `n:input_tokens`, …) that the ledger
moves and that are the truth for `request_counts.completed/failed` and
`usage`, as the SQLite columns are. `update` is a Lua script: the `if_status`
check and the write happen as one step, and no JSON is parsed inside Redis.
Batches list newest first by creation sequence.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any, cast

import redis.asyncio as aioredis

from gateway.domain import BatchStatus, Usage
from gateway.store.objects import BatchFields, BatchRecord, Page, RequestCounts, batch_fields
from gateway.store.redis.keys import Keys

_COUNTERS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
_RECORD_FIELDS = tuple(f.name for f in dataclass_fields(BatchRecord))
_WINDOW = 500  # ids read per step while a page picks one kind of id out of the owner's index

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


# KEYS: the batch, its owner's index; ARGV: batch id, owner (JSON), the unfinished statuses (JSON)
_DELETE_BATCH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
for j = 3, #ARGV do if ARGV[j] == status then return 0 end end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


def _encode(value: Any) -> str:
    return json.dumps(value.value if isinstance(value, BatchStatus) else value)


def _decode_batch(raw: dict[str, str]) -> BatchRecord:
    data = {name: json.loads(raw[name]) for name in _RECORD_FIELDS if name in raw}
    n = {name: int(raw.get(f"n:{name}", 0)) for name in _COUNTERS}
    rec = BatchRecord.from_json(data)
    rec.counts = RequestCounts(total=rec.counts.total, completed=n["completed"], failed=n["failed"])
    rec.usage = Usage(input_tokens=n["input_tokens"], output_tokens=n["output_tokens"],
                      cached_tokens=n["cached_tokens"], reasoning_tokens=n["reasoning_tokens"])
    return rec


class RedisBatches:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._put_batch = client.register_script(_PUT_BATCH)
        self._update_batch = client.register_script(_UPDATE_BATCH)
        self._delete_batch = client.register_script(_DELETE_BATCH)

    async def put(self, rec: BatchRecord) -> None:
        data = rec.to_json()
        pairs: list[str | int] = []
        for name in _RECORD_FIELDS:
            pairs += [name, _encode(data[name])]
        for name in _COUNTERS:  # like SQLite's columns: counting starts at zero
            pairs += [f"n:{name}", 0]
        active = "0" if rec.status.finished else "1"
        keys = [self._k.batch(rec.id), self._k.batches(rec.owner), self._k.batch_seq, self._k.active]
        await self._put_batch(keys=keys, args=[rec.id, active, *pairs])

    async def get(self, batch_id: str, owner: str | None = None) -> BatchRecord | None:
        raw = await self._r.hgetall(self._k.batch(batch_id))
        if not raw:
            return None
        rec = _decode_batch(cast(dict[str, str], raw))
        return None if owner is not None and rec.owner != owner else rec

    async def _batches(self, ids: Sequence[str]) -> list[BatchRecord]:
        if not ids:
            return []
        async with self._r.pipeline(transaction=False) as p:
            for batch_id in ids:
                p.hgetall(self._k.batch(batch_id))
            raws = await p.execute()
        return [_decode_batch(raw) for raw in raws if raw]

    async def page(self, owner: str, *, limit: int, after: str | None, before: str | None = None,
                   kind: str | None = None) -> Page:
        index = self._k.batches(owner)
        newer = bool(before)
        cursor = before if newer else after
        anchor = await self._r.zscore(index, cursor) if cursor else None
        # One index per owner holds every kind: a kind's ids are picked from it by prefix, a window of ids
        # at a time (ids only: no record is read for an id of another kind).
        prefix = f"{kind}_" if kind is not None else ""
        ids: list[str] = []
        low, high = ("-inf", "+inf") if anchor is None else ((f"({int(anchor)}", "+inf") if newer
                                                                 else ("-inf", f"({int(anchor)}"))
        start, window = 0, max(limit + 1, _WINDOW)
        while len(ids) <= limit:
            if newer:
                got = await self._r.zrangebyscore(index, low, high, start=start, num=window)
            else:
                got = await self._r.zrevrangebyscore(index, high, low, start=start, num=window)
            ids += [i for i in cast(list[str], got) if i.startswith(prefix)]
            if len(got) < window:
                break
            start += window
        # an index names ids; the records say whose they are: only the owner's are listed
        data = [b for b in await self._batches(ids[:limit + 1]) if b.owner == owner]
        has_more = len(data) > limit
        data = data[:limit]
        if newer:  # the page just after the cursor, still listed newest first
            data.reverse()
        return Page(data=data, has_more=has_more)

    async def update(
        self, batch_id: str, fields: BatchFields, *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        encoded = batch_fields(fields)
        args: list[str] = [batch_id]
        if if_status is None:
            args.append("-1")
        else:
            args += [str(len(if_status)), *(_encode(s) for s in if_status)]
        status = fields.get("status")
        if status is None:
            args.append("")
        else:
            args.append("finished" if status.finished else "active")
        for name, value in encoded.items():
            args += [name, json.dumps(value)]
        applied = await self._update_batch(keys=[self._k.batch(batch_id), self._k.active], args=args)
        return bool(applied)

    async def delete(self, batch_id: str, owner: str) -> bool:
        unfinished = [_encode(s) for s in BatchStatus if not s.finished]
        keys = [self._k.batch(batch_id), self._k.batches(owner)]
        return bool(await self._delete_batch(keys=keys, args=[batch_id, _encode(owner), *unfinished]))

    async def active(self) -> list[BatchRecord]:
        ids = await self._r.zrange(self._k.active, 0, -1)
        return [b for b in await self._batches(cast(list[str], ids)) if not b.status.finished]


__all__ = ["RedisBatches"]
