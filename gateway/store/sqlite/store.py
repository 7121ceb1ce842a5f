"""The embedded `Store`: SQLite in the data directory, one table group per part.

One connection per process, used from its own thread (off the event loop: `gateway.store.sqlite.db`) and
shared by the parts (`SQLiteFiles`, `SQLiteBatches`, `SQLiteLedger`, `SQLiteWebhookDeliveries`,
`SQLiteBackendState`, `SQLiteQuotaLedger`, `SQLiteRates`, `SQLiteStorageLedger`,
`SQLiteIdempotencyKeys`, `SQLiteDashboardSessions`): each call is a short transaction, so a call is atomic
with respect to every other,
in this process and in the others on the same file (the API process and its worker processes). WAL mode lets readers
(status polls) go on while a worker writes; a writer waits for another's short
transaction (`busy_timeout`). WAL with synchronous=NORMAL survives a killed
process (SIGKILL) without losing a committed write; only a power cut could
lose the last ones.
"""

from __future__ import annotations

from pathlib import Path

from gateway.store.rates import DEFAULT_WINDOW_SECONDS
from gateway.store.sqlite import (
    batches,
    files,
    idempotency,
    ledger,
    quota,
    rates,
    sessions,
    state,
    storage,
    webhooks,
)
from gateway.store.sqlite.batches import SQLiteBatches
from gateway.store.sqlite.db import Database
from gateway.store.sqlite.files import SQLiteFiles
from gateway.store.sqlite.idempotency import SQLiteIdempotencyKeys
from gateway.store.sqlite.ledger import SQLiteLedger
from gateway.store.sqlite.quota import SQLiteQuotaLedger
from gateway.store.sqlite.rates import SQLiteRates
from gateway.store.sqlite.sessions import SQLiteDashboardSessions
from gateway.store.sqlite.state import SQLiteBackendState
from gateway.store.sqlite.storage import SQLiteStorageLedger
from gateway.store.sqlite.webhooks import SQLiteWebhookDeliveries


class SQLiteStore:
    def __init__(self, path: Path, *, rate_window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self._sql = sql = Database(path)
        for part in (files, batches, ledger, state, webhooks, quota, rates, storage, idempotency, sessions):
            sql.conn.executescript(part.SCHEMA)
        self.files = SQLiteFiles(sql)
        self.batches = SQLiteBatches(sql)
        self.ledger = SQLiteLedger(sql)
        self.backend_state = SQLiteBackendState(sql)
        self.webhooks = SQLiteWebhookDeliveries(sql)
        self.quota = SQLiteQuotaLedger(sql)
        self.rates = SQLiteRates(sql, rate_window_seconds)
        self.storage = SQLiteStorageLedger(sql)
        self.idempotency = SQLiteIdempotencyKeys(sql)
        self.sessions = SQLiteDashboardSessions(sql)

    async def aclose(self) -> None:
        await self._sql.aclose()


__all__ = ["SQLiteStore"]
