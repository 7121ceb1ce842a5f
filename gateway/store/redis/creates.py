"""Creates under way, so that the sweep can clean up after one that stopped half way.

A batch or file is created in ordered single-slot steps (`gateway.store.redis.batches`, `…files`): its
index entries first, its record last. A crash between them leaves index entries naming no record: every
reader skips them, but nothing else would ever remove them (a batch's index scores are sequence numbers,
not times). So a create first notes itself here (`creating:{kind}`, a zset of its own slot, score = when it
began, one member per create: the entries it writes and a random token), and lets go of the note after its
record is written: two round trips per create, none per request.

The sweep (`claim`) takes the notes older than `CREATE_GRACE_SECONDS` one at a time (`ZREM`: one sweeper
gets each) and each store removes the entries the record does not back. A create that is merely slow (a
process paused for longer than the grace) keeps its entries whichever finishes first:
- the create writes its record, then lets go of its note; a `ZREM` that finds the note gone (the sweep
  took it) writes its index entries again (idempotent);
- the sweep takes the note, removes the entries the record does not back, then reads the record again and
  puts back any entry it now backs.
Each side's last step follows the other's first, so the entries end up where the record says.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, cast

CREATE_GRACE_SECONDS = 600.0  # a create this old that has not written its record has stopped (or will redo it)


class PendingCreates:
    def __init__(self, client: Any, key: str) -> None:
        self._r, self._key = client, key

    async def begin(self, *parts: str) -> str:
        """Note a create of what `parts` name (each store says what), before its first write."""
        member = json.dumps([*parts, secrets.token_hex(8)])
        await self._r.zadd(self._key, {member: time.time()})
        return member

    async def end(self, member: str) -> bool:
        """The record is written: let go of the note. False: the sweep had taken it (write the index again)."""
        return bool(await self._r.zrem(self._key, member))

    async def claim(self, at: float, limit: int = 100) -> list[list[str]]:
        """The parts of creates begun before `at - CREATE_GRACE_SECONDS` and not ended, each taken by this
        caller alone (it repairs what they left)."""
        due = cast(list[str], await self._r.zrangebyscore(self._key, "-inf", at - CREATE_GRACE_SECONDS,
                                                          start=0, num=limit))
        taken = []
        for member in due:
            if await self._r.zrem(self._key, member):
                taken.append(cast(list[str], json.loads(member))[:-1])
        return taken


__all__ = ["CREATE_GRACE_SECONDS", "PendingCreates"]
