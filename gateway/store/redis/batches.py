"""The shared `BatchStore`: batch records in Redis (see `gateway.store.redis.store`).

A batch is one hash: every `BatchRecord` field JSON-encoded in its own field,
plus integer counters (`n:completed`, `n:input_tokens`, …) that the ledger
moves and that are the truth for `request_counts.completed/failed` and
`usage`, as the SQLite columns are. `update` is a Lua script: the `if_status`
check and the write happen as one step, and no JSON is parsed inside Redis.
Batches list newest first by creation sequence.

The record (the batch's slot), its owner's list (the team's slot), the creation sequence and the
`active-batches` index (each its own slot) are written in ordered single-slot steps, never in one script
(see `gateway.store.redis.keys`). Each order leaves, after a crash at any step, only what readers tolerate:
- create: the sequence, then the indexes (`ZADD NX`), then the record LAST: an index entry whose record is
  missing is skipped by every reader (`_batches`), and a batch never exists outside its indexes (the sweep
  finds every unfinished one through `active-batches`); the create is noted first and let go of last
  (`gateway.store.redis.creates`), so the sweep removes the entries of one that stopped (`tidy`);
- finish: the status changes in the record (one script, with its `if_status` check), THEN `active-batches`
  lets go of it: meanwhile, or after a crash, `active()` reads the record, skips a finished one and drops it
  from the index; back to unfinished (the index first): the reverse;
- delete (a finished batch): the record first (the script checks owner and status), then the owner's list:
  an entry left behind names no record and is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any, cast

import redis.asyncio as aioredis

from gateway.domain import BatchStatus, Usage
from gateway.store.records import BatchFields, BatchRecord, Page, RequestCounts, batch_fields
from gateway.store.redis.creates import PendingCreates
from gateway.store.redis.keys import Keys

_COUNTERS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
_RECORD_FIELDS = tuple(f.name for f in dataclass_fields(BatchRecord))
_WINDOW = 500  # ids read per step while a page picks one kind of id out of the owner's index

# KEYS: the batch. ARGV: batch id, seq, field/value pairs. Refused when the batch exists.
_PUT_BATCH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('batch ' .. ARGV[1] .. ' exists') end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], unpack(ARGV, 3))
return 1
"""

# KEYS: the batch. ARGV: batch id, n (-1: no condition), n allowed statuses, field/value pairs
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
if #ARGV >= i then redis.call('HSET', KEYS[1], unpack(ARGV, i)) end
return 1
"""


# KEYS: the batch; ARGV: batch id, owner (JSON), the unfinished statuses (JSON)
_DELETE_BATCH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
for j = 3, #ARGV do if ARGV[j] == status then return 0 end end
redis.call('DEL', KEYS[1])
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
        self._creates = PendingCreates(client, keys.creating("batches"))

    async def put(self, rec: BatchRecord) -> None:
        seq, note = await self._index(rec)
        await self._record(rec, seq, note)

    async def _index(self, rec: BatchRecord) -> tuple[int, str]:
        """A create's first steps: its note (`gateway.store.redis.creates`), its sequence, its indexes."""
        note = await self._creates.begin(rec.id, rec.owner)
        seq = int(await self._r.incr(self._k.batch_seq))
        await self._add_indexes(rec.id, rec.owner, seq, active=not rec.status.finished)
        return seq, note

    async def _record(self, rec: BatchRecord, seq: int, note: str) -> None:
        """A create's last steps: the record, then its note let go of (the indexes again if the sweep took it)."""
        data = rec.to_json()
        pairs: list[str | int] = []
        for name in _RECORD_FIELDS:
            pairs += [name, _encode(data[name])]
        for name in _COUNTERS:  # like SQLite's columns: counting starts at zero
            pairs += [f"n:{name}", 0]
        await self._put_batch(keys=[self._k.batch(rec.id)], args=[rec.id, seq, *pairs])
        if not await self._creates.end(note):
            await self._add_indexes(rec.id, rec.owner, seq, active=not rec.status.finished)

    async def _add_indexes(self, batch_id: str, owner: str, seq: int, *, active: bool) -> None:
        # NX: a batch that exists keeps its place
        async with self._r.pipeline(transaction=False) as p:
            p.zadd(self._k.batches(owner), {batch_id: seq}, nx=True)
            if active:
                p.zadd(self._k.active, {batch_id: seq}, nx=True)
            await p.execute()

    async def _owned(self, batch_id: str, owner: str) -> tuple[int, bool] | None:
        """(seq, finished) of the batch's record when it is `owner`'s, else None."""
        raw = await self._r.hmget(self._k.batch(batch_id), ["owner", "seq", "status"])
        raw_owner, seq, status = cast(list[str | None], raw)
        if raw_owner is None or seq is None or status is None or json.loads(raw_owner) != owner:
            return None
        return int(seq), BatchStatus(json.loads(status)).finished

    async def tidy(self, at: float) -> int:
        """Remove the index entries of creates that stopped before their record, begun more than the grace
        before `at` (`gateway.store.redis.creates`); how many creates had left some."""
        left = 0
        for batch_id, owner in await self._creates.claim(at):
            if await self._owned(batch_id, owner) is not None:
                continue  # the record is written: only its note was left
            left += 1
            await self._r.zrem(self._k.batches(owner), batch_id)
            if not await self._r.exists(self._k.batch(batch_id)):
                await self._r.zrem(self._k.active, batch_id)
            if (now := await self._owned(batch_id, owner)) is not None:  # a slow create wrote it meanwhile
                await self._add_indexes(batch_id, owner, now[0], active=not now[1])
        return left

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
        for name, value in encoded.items():
            args += [name, json.dumps(value)]
        if status is not None and not status.finished:  # back to unfinished: the index first
            seq = await self._r.hget(self._k.batch(batch_id), "seq")
            if seq is not None:
                await self._r.zadd(self._k.active, {batch_id: int(seq)}, nx=True)
        applied = await self._update_batch(keys=[self._k.batch(batch_id)], args=args)
        if applied and status is not None and status.finished:  # finished: the index after the record
            await self._r.zrem(self._k.active, batch_id)
        return bool(applied)

    async def delete(self, batch_id: str, owner: str) -> bool:
        unfinished = [_encode(s) for s in BatchStatus if not s.finished]
        deleted = await self._delete_batch(keys=[self._k.batch(batch_id)], args=[batch_id, _encode(owner), *unfinished])
        if deleted:  # the record first, then the list (see the module's docstring)
            await self._r.zrem(self._k.batches(owner), batch_id)
        return bool(deleted)

    async def active(self) -> list[BatchRecord]:
        ids = await self._r.zrange(self._k.active, 0, -1)
        found = await self._batches(cast(list[str], ids))
        # A finished batch still listed (its update's second step not done yet, or never: a crash) is let go
        # here; an id without a record is left alone: its create may be between its two steps right now.
        if done := [b.id for b in found if b.status.finished]:
            await self._r.zrem(self._k.active, *done)
        return [b for b in found if not b.status.finished]


__all__ = ["RedisBatches"]
