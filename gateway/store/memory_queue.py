"""The embedded `Queue`: shards waiting in this process.

Not durable by itself: after a restart the pipeline re-enqueues the unfinished
shards it finds in the `Store`, which is the durable record.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Collection

from gateway.records import Shard
from gateway.store.base import Delivery


class MemoryQueue:
    def __init__(self) -> None:
        self._items: deque[Shard] = deque()
        self._changed = asyncio.Condition()

    async def put(self, shard: Shard) -> None:
        async with self._changed:
            self._items.append(shard)
            self._changed.notify_all()

    def _take(self, routes: Collection[str] | None) -> Shard | None:
        for i, shard in enumerate(self._items):
            if routes is None or shard.route in routes:
                del self._items[i]
                return shard
        return None

    async def get(self, routes: Collection[str] | None, timeout: float) -> Delivery | None:
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    while (shard := self._take(routes)) is None:
                        await self._changed.wait()
            except TimeoutError:
                return None
        return Delivery(shard=shard, token=shard.key)

    async def ack(self, delivery: Delivery) -> None:
        return None

    async def depth(self) -> dict[str, int]:
        return dict(Counter(s.route for s in self._items))

    async def aclose(self) -> None:
        return None
