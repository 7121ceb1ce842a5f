"""The embedded `StorageLedger` (`gateway.store.storage`): a table in the embedded SQLite file, checked and
written in one transaction; a file's record is looked up in the `files` table of the same file."""

from __future__ import annotations

import time

from gateway.store.sqlite.db import Database, immediate, off_loop
from gateway.store.storage import STALE_SECONDS

SCHEMA = """
CREATE TABLE IF NOT EXISTS file_storage (
    file_id TEXT PRIMARY KEY, team TEXT NOT NULL, bytes INTEGER NOT NULL, pending_since REAL
);
CREATE INDEX IF NOT EXISTS file_storage_team ON file_storage(team);
"""


class SQLiteStorageLedger:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    def _used(self, team: str, but: str = "") -> int:
        (total,) = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM file_storage WHERE team = ? AND file_id != ?",
                                    (team, but)).fetchone()
        return int(total)

    @off_loop
    def reserve(self, team: str, file_id: str, size: int, limit: int) -> bool:
        t = time.time()
        with immediate(self._db):  # the check and the write under one lock: no two pass the last byte
            self._db.execute("DELETE FROM file_storage WHERE team = ? AND pending_since < ? "
                             "AND file_id NOT IN (SELECT id FROM files)", (team, t - STALE_SECONDS))
            fits = self._used(team, file_id) + size <= limit
            if fits:
                self._db.execute("INSERT OR REPLACE INTO file_storage VALUES (?, ?, ?, ?)", (file_id, team, size, t))
            else:
                self._db.execute("DELETE FROM file_storage WHERE file_id = ?", (file_id,))
        return fits

    @off_loop
    def settle(self, team: str, file_id: str, size: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO file_storage VALUES (?, ?, ?, NULL)", (file_id, team, size))

    @off_loop
    def hold(self, team: str, file_id: str) -> None:
        self._db.execute("UPDATE file_storage SET pending_since = ? WHERE file_id = ?", (time.time(), file_id))

    @off_loop
    def release(self, team: str, file_id: str) -> None:
        self._db.execute("DELETE FROM file_storage WHERE file_id = ?", (file_id,))

    @off_loop
    def used(self, team: str) -> int:
        return self._used(team)


__all__ = ["SCHEMA", "SQLiteStorageLedger"]
