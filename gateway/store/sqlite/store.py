"""The embedded `Store`: SQLite in the data directory, one table group per part.

One connection per process, used from the event loop's thread and shared by
the parts (`SQLiteFiles`, `SQLiteBatches`, `SQLiteLedger`, `SQLiteWebhookDeliveries`,
`SQLiteBackendState`, `SQLiteQuotaLedger`, `SQLiteRates`, `SQLiteStorageLedger`): each call is a
short transaction, so a call is atomic with respect to every other, in this process and in the others on the same
file (the API process and its worker processes). WAL mode lets readers
(status polls) go on while a worker writes; a writer waits for another's short
transaction (`busy_timeout`). WAL with synchronous=NORMAL survives a killed
process (SIGKILL) without losing a committed write; only a power cut could
lose the last ones.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.store.rates import DEFAULT_WINDOW_SECONDS
from gateway.store.sqlite import batches, files, ledger, quota, rates, state, storage, webhooks
from gateway.store.sqlite.batches import SQLiteBatches
from gateway.store.sqlite.files import SQLiteFiles
from gateway.store.sqlite.ledger import SQLiteLedger
from gateway.store.sqlite.quota import SQLiteQuotaLedger
from gateway.store.sqlite.rates import SQLiteRates
from gateway.store.sqlite.state import SQLiteBackendState
from gateway.store.sqlite.storage import SQLiteStorageLedger
from gateway.store.sqlite.webhooks import SQLiteWebhookDeliveries

BUSY_TIMEOUT_MS = 30_000


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the embedded database, as every part that shares it opens one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class SQLiteStore:
    def __init__(self, path: Path, *, rate_window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self._db = connect(path)
        for part in (files, batches, ledger, state, webhooks, quota, rates, storage):
            self._db.executescript(part.SCHEMA)
        self.files = SQLiteFiles(self._db)
        self.batches = SQLiteBatches(self._db)
        self.ledger = SQLiteLedger(self._db)
        self.backend_state = SQLiteBackendState(self._db)
        self.webhooks = SQLiteWebhookDeliveries(self._db)
        self.quota = SQLiteQuotaLedger(self._db)
        self.rates = SQLiteRates(self._db, rate_window_seconds)
        self.storage = SQLiteStorageLedger(self._db)

    async def aclose(self) -> None:
        self._db.close()


__all__ = ["BUSY_TIMEOUT_MS", "SQLiteStore", "connect"]
