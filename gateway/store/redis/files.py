"""The shared `FileStore`: file records in Redis (see `gateway.store.redis.store`).

Lists follow SQLite's order: by (created_at, id) either way from an `after`
anchor, from a sorted set per owner (and per owner and purpose).

The record (`file:{id}`, its own slot), the owner's lists (the team's slot) and `file-expiry` (its own slot)
are written in ordered single-slot steps (`gateway.store.redis.keys`), each safe to stop after:
- put: the indexes first, the record LAST: an id listed without a record is skipped by every reader
  (`_files`), so a crash leaves at most an entry nobody sees; never a file no list or expiry knows; the put
  is noted first and let go of last (`gateway.store.redis.creates`), so the sweep removes the entries of one
  that stopped (`tidy`);
- delete: the record first (its DEL says who deleted it), then the indexes: an entry left behind names no
  record and is skipped; `expired` drops such an entry from `file-expiry` once its expiry has passed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

import redis.asyncio as aioredis

from gateway.store.records import FileRecord, Page
from gateway.store.redis.connection import get_many
from gateway.store.redis.creates import PendingCreates
from gateway.store.redis.keys import Keys


class RedisFiles:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r, self._k = client, keys
        self._creates = PendingCreates(client, keys.creating("files"))

    async def put(self, rec: FileRecord) -> None:
        old, note = await self._index(rec)
        await self._record(rec, old, note)

    async def _index(self, rec: FileRecord) -> tuple[FileRecord | None, str]:
        """A put's first steps: its note (`gateway.store.redis.creates`), the indexes."""
        note = await self._creates.begin(rec.id, rec.owner, rec.purpose)
        old = await self.get(rec.id)
        await self._add_indexes(rec)
        return old, note

    async def _record(self, rec: FileRecord, old: FileRecord | None, note: str) -> None:
        """A put's last steps: the record, its note let go of (the indexes again if the sweep took it), then
        the old owner's and purpose's entries."""
        await self._r.set(self._k.file(rec.id), json.dumps(rec.to_json()))
        if not await self._creates.end(note):
            await self._add_indexes(rec)
        if old is not None and (old.owner, old.purpose) != (rec.owner, rec.purpose):
            async with self._r.pipeline(transaction=True) as tx:  # the old owner's slot
                if old.owner != rec.owner:
                    tx.zrem(self._k.files(old.owner), old.id)
                tx.zrem(self._k.files(old.owner, old.purpose), old.id)
                await tx.execute()
        if rec.expires_at is None and (old is None or old.expires_at is not None):
            await self._r.zrem(self._k.file_expiry, rec.id)

    async def _add_indexes(self, rec: FileRecord) -> None:
        async with self._r.pipeline(transaction=True) as tx:  # the team's slot
            tx.zadd(self._k.files(rec.owner), {rec.id: rec.created_at})
            tx.zadd(self._k.files(rec.owner, rec.purpose), {rec.id: rec.created_at})
            await tx.execute()
        if rec.expires_at is not None:
            await self._r.zadd(self._k.file_expiry, {rec.id: rec.expires_at})

    async def tidy(self, at: float) -> int:
        """Remove the index entries of puts that stopped before their record, begun more than the grace
        before `at` (`gateway.store.redis.creates`); how many puts had left some."""
        left = 0
        for file_id, owner, purpose in await self._creates.claim(at):
            rec = await self.get(file_id)
            if rec is not None and (rec.owner, rec.purpose) == (owner, purpose):
                continue  # the record is written: only its note was left
            left += 1
            async with self._r.pipeline(transaction=True) as tx:  # the owner's slot: what the record does not back
                if rec is None or rec.owner != owner:
                    tx.zrem(self._k.files(owner), file_id)
                tx.zrem(self._k.files(owner, purpose), file_id)
                await tx.execute()
            if rec is None:
                await self._r.zrem(self._k.file_expiry, file_id)
            again = await self.get(file_id)  # a slow put wrote its record meanwhile: its entries back
            if again is not None and (again.owner, again.purpose) == (owner, purpose):
                await self._add_indexes(again)
        return left

    async def get(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        raw = await self._r.get(self._k.file(file_id))
        if raw is None:
            return None
        rec = FileRecord.from_json(json.loads(raw))
        return None if owner is not None and rec.owner != owner else rec

    async def page(self, owner: str, *, purpose: str | None, limit: int, order: str, after: str | None) -> Page:
        index = self._k.files(owner, purpose)
        asc = order == "asc"
        anchor = await self.get(after, owner) if after else None
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
        # an index names ids; the records say whose they are: only the owner's are listed
        data = [f for f in await self._files(cast(list[str], ids))
                if f.owner == owner and (not purpose or f.purpose == purpose)]
        return Page(data=data[:limit], has_more=len(data) > limit)

    async def _files(self, ids: Sequence[str]) -> list[FileRecord]:
        if not ids:
            return []
        raws = await get_many(self._r, [self._k.file(i) for i in ids])
        return [FileRecord.from_json(json.loads(raw)) for raw in raws if raw is not None]

    async def delete(self, file_id: str, owner: str | None = None) -> bool:
        rec = await self.get(file_id, owner)
        if rec is None:
            return False
        deleted = await self._r.delete(self._k.file(file_id))  # the record first (see the module's docstring)
        async with self._r.pipeline(transaction=True) as tx:  # the team's slot
            tx.zrem(self._k.files(rec.owner), file_id)
            tx.zrem(self._k.files(rec.owner, rec.purpose), file_id)
            await tx.execute()
        await self._r.zrem(self._k.file_expiry, file_id)
        return bool(deleted)

    async def expired(self, at: int, limit: int = 100) -> list[FileRecord]:
        ids = cast(list[str], await self._r.zrangebyscore(self._k.file_expiry, "-inf", f"({at}", start=0, num=limit))
        if not ids:
            return []
        raws = await get_many(self._r, [self._k.file(i) for i in ids])
        # an expired id without a record: a delete stopped between its steps; no put can still be under way
        if gone := [i for i, raw in zip(ids, raws, strict=True) if raw is None]:
            await self._r.zrem(self._k.file_expiry, *gone)
        return [FileRecord.from_json(json.loads(raw)) for raw in raws if raw is not None]


__all__ = ["RedisFiles"]
