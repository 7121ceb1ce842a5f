"""The shared `WebhookDeliveries`: a string per delivery, a due set, and per-team recent lists, in
Redis (key names in `gateway.store.redis.keys`).

The record (`webhook:{id}`), `webhooks-due`, the team's list and `webhooks-all` are in different slots:
written in ordered steps, each safe to stop after. `add`: the due entry first (NX), then the record (SET NX:
the one that decides whether the delivery is new), then the lists: a crash leaves a due id without a record
(skipped, and dropped by `due` once its time is long past) or a delivery the dashboard does not list; never
a pending delivery nothing will try. `save`: the record, then the due entry; `due` drops the id of a
delivery that is no longer pending (a crash between the two)."""

from __future__ import annotations

import json
from typing import Any

from gateway.store.redis.connection import as_text, get_many
from gateway.store.redis.keys import Keys
from gateway.store.webhook_deliveries import PENDING, WebhookDelivery

_KEEP = 1000  # per team (and in all): the dashboard shows the newest; older records expire below
_TTL_SECONDS = 30 * 86400  # a finished delivery's record outlives any retry window
_ORPHAN_SECONDS = 3600.0  # a due id this far past its time and still without a record has none coming


class RedisWebhookDeliveries:
    def __init__(self, client: Any, keys: Keys) -> None:
        self._r, self._k = client, keys

    def _key(self, delivery_id: str) -> str:
        return self._k.webhook(delivery_id)

    def _recent(self, owner: str | None) -> str:
        return self._k.webhooks(owner)

    async def add(self, delivery: WebhookDelivery) -> bool:
        # the due entry first, the record last (see the module's docstring); NX: a delivery already there
        # keeps its own time
        await self._r.zadd(self._k.webhooks_due, {delivery.id: delivery.next_at}, nx=True)
        if not await self._r.set(self._key(delivery.id), json.dumps(delivery.to_json()), nx=True, ex=_TTL_SECONDS):
            return False
        seq = await self._r.incr(self._k.webhook_seq)
        for key in (self._recent(delivery.owner), self._recent(None)):
            async with self._r.pipeline(transaction=True) as tx:  # one key: one slot
                tx.zadd(key, {delivery.id: seq})
                tx.zremrangebyrank(key, 0, -_KEEP - 1)
                await tx.execute()
        return True

    async def due(self, now: float, limit: int) -> list[WebhookDelivery]:
        pairs = await self._r.zrangebyscore(self._k.webhooks_due, "-inf", now, start=0, num=limit, withscores=True)
        ids, times = [as_text(i) for i, _ in pairs], [float(at) for _, at in pairs]
        raws = await get_many(self._r, [self._key(i) for i in ids])
        found = [WebhookDelivery.from_json(json.loads(raw)) if raw is not None else None for raw in raws]
        # No longer pending (a save stopped between its steps), or no record long after its time (an add
        # stopped before its record, or the record expired): dropped from the due set.
        stale = [i for i, d, at in zip(ids, found, times, strict=True)
                 if (d is not None and d.state != PENDING) or (d is None and at < now - _ORPHAN_SECONDS)]
        if stale:
            await self._r.zrem(self._k.webhooks_due, *stale)
        return [d for d in found if d is not None and d.state == PENDING]

    async def save(self, delivery: WebhookDelivery) -> None:
        await self._r.set(self._key(delivery.id), json.dumps(delivery.to_json()), ex=_TTL_SECONDS)
        if delivery.state == PENDING:
            await self._r.zadd(self._k.webhooks_due, {delivery.id: delivery.next_at})
        else:
            await self._r.zrem(self._k.webhooks_due, delivery.id)

    async def recent(self, owner: str | None, limit: int) -> list[WebhookDelivery]:
        found = await self._load(await self._r.zrevrange(self._recent(owner), 0, limit - 1))
        return [d for d in found if owner is None or d.owner == owner]  # the records say whose they are

    async def _load(self, ids: list[Any]) -> list[WebhookDelivery]:
        if not ids:
            return []
        raws = await get_many(self._r, [self._key(as_text(i)) for i in ids])
        return [WebhookDelivery.from_json(json.loads(raw)) for raw in raws if raw is not None]

