"""The shared `WebhookDeliveries`: a string per delivery, a due set, and per-team recent lists, in
Redis (key names in `gateway.store.redis.keys`)."""

from __future__ import annotations

import json
from typing import Any

from gateway.store.redis.keys import Keys
from gateway.store.webhook_deliveries import PENDING, WebhookDelivery

_KEEP = 1000  # per team (and in all): the dashboard shows the newest; older records expire below
_TTL_SECONDS = 30 * 86400  # a finished delivery's record outlives any retry window


class RedisWebhookDeliveries:
    def __init__(self, client: Any, keys: Keys) -> None:
        self._r, self._k = client, keys

    def _key(self, delivery_id: str) -> str:
        return self._k.webhook(delivery_id)

    def _recent(self, owner: str | None) -> str:
        return self._k.webhooks(owner)

    async def add(self, delivery: WebhookDelivery) -> bool:
        if not await self._r.set(self._key(delivery.id), json.dumps(delivery.to_json()), nx=True, ex=_TTL_SECONDS):
            return False
        seq = await self._r.incr(self._k.webhook_seq)
        async with self._r.pipeline(transaction=True) as tx:
            tx.zadd(self._k.webhooks_due, {delivery.id: delivery.next_at})
            for key in (self._recent(delivery.owner), self._recent(None)):
                tx.zadd(key, {delivery.id: seq})
                tx.zremrangebyrank(key, 0, -_KEEP - 1)
            await tx.execute()
        return True

    async def due(self, now: float, limit: int) -> list[WebhookDelivery]:
        ids = await self._r.zrangebyscore(self._k.webhooks_due, "-inf", now, start=0, num=limit)
        return [d for d in await self._load(ids) if d.state == PENDING]

    async def save(self, delivery: WebhookDelivery) -> None:
        async with self._r.pipeline(transaction=True) as tx:
            tx.set(self._key(delivery.id), json.dumps(delivery.to_json()), ex=_TTL_SECONDS)
            if delivery.state == PENDING:
                tx.zadd(self._k.webhooks_due, {delivery.id: delivery.next_at})
            else:
                tx.zrem(self._k.webhooks_due, delivery.id)
            await tx.execute()

    async def recent(self, owner: str | None, limit: int) -> list[WebhookDelivery]:
        found = await self._load(await self._r.zrevrange(self._recent(owner), 0, limit - 1))
        return [d for d in found if owner is None or d.owner == owner]  # the records say whose they are

    async def _load(self, ids: list[Any]) -> list[WebhookDelivery]:
        if not ids:
            return []
        raws = await self._r.mget([self._key(i.decode() if isinstance(i, bytes) else i) for i in ids])
        return [WebhookDelivery.from_json(json.loads(raw)) for raw in raws if raw is not None]
