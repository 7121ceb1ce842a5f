"""The embedded `StorageLedger` (`gateway.store.storage`): a table in the embedded SQLite file, checked and
written in one transaction; a file's record is looked up in the `files` table of the same file."""

from __future__ import annotations

import sqlite3
import time

from gateway.store.storage import STALE_SECONDS

SCHEMA = """
CREATE TABLE IF NOT EXISTS file_storage (
    file_id TEXT PRIMARY KEY, team TEXT NOT NULL, bytes INTEGER NOT NULL, pending_since REAL
);
CREATE INDEX IF NOT EXISTS file_storage_team ON file_storage(team);
"""


class SQLiteStorageLedger:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def _used(self, team: str, but: str = "") -> int:
        (total,) = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM file_storage WHERE team = ? AND file_id != ?",
                                    (team, but)).fetchone()
        return int(total)

    async def reserve(self, team: str, file_id: str, size: int, limit: int) -> bool:
        t = time.time()
        self._db.execute("BEGIN IMMEDIATE")  # the check and the write under one lock: no two pass the last byte
        try:
            self._db.execute("DELETE FROM file_storage WHERE team = ? AND pending_since < ? "
                             "AND file_id NOT IN (SELECT id FROM files)", (team, t - STALE_SECONDS))
            fits = self._used(team, file_id) + size <= limit
            if fits:
                self._db.execute("INSERT OR REPLACE INTO file_storage VALUES (?, ?, ?, ?)", (file_id, team, size, t))
            else:
                self._db.execute("DELETE FROM file_storage WHERE file_id = ?", (file_id,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return fits

    async def settle(self, team: str, file_id: str, size: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO file_storage VALUES (?, ?, ?, NULL)", (file_id, team, size))

    async def hold(self, team: str, file_id: str) -> None:
        self._db.execute("UPDATE file_storage SET pending_since = ? WHERE file_id = ?", (time.time(), file_id))

    async def release(self, team: str, file_id: str) -> None:
        self._db.execute("DELETE FROM file_storage WHERE file_id = ?", (file_id,))

    async def used(self, team: str) -> int:
        return self._used(team)


__all__ = ["SCHEMA", "SQLiteStorageLedger"]
