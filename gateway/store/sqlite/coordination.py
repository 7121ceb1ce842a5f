"""The embedded `Coordination`: leases and heartbeats in tables of the embedded SQLite file.

They let the processes of one machine (the API process and its worker processes, or `batchyard run` and its
helpers) share leases and heartbeats through the same file as the `SQLiteStore`, with no server.

- `leases`: a row per lease with its holder and expiry, renewed while held (`gateway.store.leases`), so two
  processes never validate or finalize one batch at once, and one that dies mid-way leaves a lease that
  expires.
- `concurrency_shares`: a `batch_mode: background` route's allowed concurrency and each worker's part of it
  (`gateway.scheduling.busy_server`), one JSON row per route, read and written in one transaction.
- `workers`: a row per live worker with its heartbeat's expiry. The embedded queue
  (`gateway.store.sqlite.queue`) takes a shard over only from a worker whose heartbeat is gone.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from gateway.scheduling.busy_server import ShareAsk, ShareState, exchange
from gateway.store.leases import hold
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (what TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS workers (name TEXT PRIMARY KEY, info TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS concurrency_shares (route TEXT PRIMARY KEY, state TEXT NOT NULL);
"""

LEASE_SECONDS = 30.0


class SQLiteCoordination:
    def __init__(self, path: Path, holder: str, ttl: float = LEASE_SECONDS) -> None:
        self.sql = Database(path)
        self._db = self.sql.conn
        self._db.executescript(SCHEMA)
        self.holder, self.ttl = holder, ttl

    # -- leases ------------------------------------------------------------------

    @off_loop
    def acquire(self, what: str, ttl: float | None = None) -> bool:
        at = time.time()
        cur = self._db.execute(
            "INSERT INTO leases (what, holder, expires_at) VALUES (?, ?, ?) ON CONFLICT (what) DO UPDATE SET "
            "holder = excluded.holder, expires_at = excluded.expires_at WHERE leases.expires_at < ?",
            (what, self.holder, at + (ttl or self.ttl), at),
        )
        return cur.rowcount == 1

    @off_loop
    def release(self, what: str) -> None:
        self._db.execute("DELETE FROM leases WHERE what = ? AND holder = ?", (what, self.holder))

    @off_loop
    def held(self, what: str) -> bool:
        row = self._db.execute("SELECT 1 FROM leases WHERE what = ? AND expires_at >= ?", (what, time.time()))
        return row.fetchone() is not None

    @off_loop
    def renew(self, what: str) -> None:
        self._db.execute("UPDATE leases SET expires_at = ? WHERE what = ? AND holder = ?",
                         (time.time() + self.ttl, what, self.holder))

    def lease(self, what: str) -> contextlib.AbstractAsyncContextManager[bool]:
        return hold(self, what)

    @off_loop
    def reset(self) -> None:
        """Forget every lease and heartbeat: the owner of the data directory is starting, so whoever
        held them is gone (its worker processes end with it)."""
        self._db.execute("DELETE FROM leases")
        self._db.execute("DELETE FROM workers")

    # -- heartbeats ----------------------------------------------------------------

    @off_loop
    def beat(self, name: str, info: dict[str, Any], ttl: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO workers (name, info, expires_at) VALUES (?, ?, ?)",
                         (name, json.dumps(info), time.time() + ttl))

    @off_loop
    def gone(self, name: str) -> None:
        self._db.execute("DELETE FROM workers WHERE name = ?", (name,))

    @off_loop
    def live_workers(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT info FROM workers WHERE expires_at > ? ORDER BY name", (time.time(),))
        return [json.loads(r[0]) for r in rows.fetchall()]

    # -- shared concurrency --------------------------------------------------------

    @off_loop
    def share_concurrency(self, ask: ShareAsk) -> ShareState:
        with immediate(self._db):  # the read and the write under one lock, across processes
            row = self._db.execute("SELECT state FROM concurrency_shares WHERE route = ?", (ask.route,)).fetchone()
            state, reply = exchange(json.loads(row[0]) if row else None, ask)
            self._db.execute("INSERT OR REPLACE INTO concurrency_shares (route, state) VALUES (?, ?)",
                             (ask.route, json.dumps(state)))
        return reply

    async def aclose(self) -> None:
        await self.sql.aclose()


__all__ = ["LEASE_SECONDS", "SCHEMA", "SQLiteCoordination"]
