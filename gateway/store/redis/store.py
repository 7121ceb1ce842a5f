"""The shared `Store`: records in Redis, for API replicas and workers on many machines.

It keeps the SQLite store's semantics exactly (see `gateway.store.sqlite.store`);
the parts share one client:

- `RedisFiles` (`gateway.store.redis.files`): a string per file, sorted sets
  per owner for SQLite's list order;
- `RedisBatches` (`gateway.store.redis.batches`): a hash per batch, with the
  counters the ledger moves; `update` is atomic with its `if_status` check;
- `RedisLedger` (`gateway.store.redis.ledger`): shard table, attempts, the
  journal and route stats; `record_results` counts each line once;
- `RedisBackendState` (`gateway.store.redis.state`);
- `RedisWebhookDeliveries` (`gateway.store.redis.webhooks`): a string per
  delivery, a due set, per-team recent lists;
- `RedisQuotaLedger` (`gateway.store.redis.quota`): the teams' admitted batches
  and spend;
- `RedisRates` (`gateway.store.redis.rates`): the teams' rpm/tpm windows;
- `RedisStorageLedger` (`gateway.store.redis.storage`): the bytes of the teams' uploads;
- `RedisIdempotencyKeys` (`gateway.store.redis.idempotency`): the teams' idempotency keys.
- `RedisDashboardSessions` (`gateway.store.redis.sessions`): the dashboard's login sessions.

Key names live in `gateway.store.redis.keys`: a batch's keys share its hash tag and a team's ledgers
theirs, so each script touches one slot; a record and its indexes are written in ordered single-slot steps
(see each part).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.store.rates import DEFAULT_WINDOW_SECONDS
from gateway.store.redis.batches import RedisBatches
from gateway.store.redis.files import RedisFiles
from gateway.store.redis.idempotency import RedisIdempotencyKeys
from gateway.store.redis.keys import Keys
from gateway.store.redis.ledger import RedisLedger
from gateway.store.redis.quota import RedisQuotaLedger
from gateway.store.redis.rates import RedisRates
from gateway.store.redis.sessions import RedisDashboardSessions
from gateway.store.redis.state import RedisBackendState
from gateway.store.redis.storage import RedisStorageLedger
from gateway.store.redis.webhooks import RedisWebhookDeliveries


class RedisStore:
    def __init__(self, client: aioredis.Redis, keys: Keys | None = None, *, owns_client: bool = True,
                 rate_window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self._r = client
        self._owns_client = owns_client
        keys = keys or Keys()
        self.files = RedisFiles(client, keys)
        self.batches = RedisBatches(client, keys)
        self.ledger = RedisLedger(client, keys)
        self.backend_state = RedisBackendState(client, keys)
        self.webhooks = RedisWebhookDeliveries(client, keys)
        self.quota = RedisQuotaLedger(client, keys)
        self.rates = RedisRates(client, keys, rate_window_seconds)
        self.storage = RedisStorageLedger(client, keys)
        self.idempotency = RedisIdempotencyKeys(client, keys)
        self.sessions = RedisDashboardSessions(client, keys)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._r.aclose()


__all__ = ["RedisStore"]
