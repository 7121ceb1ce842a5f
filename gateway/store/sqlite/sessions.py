"""The embedded `DashboardSessions` (`gateway.store.sessions`): a table in the embedded SQLite file, one row per
session, keyed by the id's digest; lapsed rows go whenever a session is opened."""

from __future__ import annotations

import time

from gateway.store.sessions import Session
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS dashboard_sessions (
    name TEXT PRIMARY KEY, key_digest TEXT NOT NULL, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS dashboard_sessions_expiry ON dashboard_sessions(expires_at);
"""


class SQLiteDashboardSessions:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def open(self, name: str, session: Session) -> None:
        with immediate(self._db):
            # Lapsed sessions go here, every team's (the index makes it cheap): nothing else sweeps the table.
            self._db.execute("DELETE FROM dashboard_sessions WHERE expires_at <= ?", (time.time(),))
            self._db.execute("INSERT OR REPLACE INTO dashboard_sessions (name, key_digest, expires_at) "
                             "VALUES (?, ?, ?)", (name, session.key_digest, session.expires_at))

    @off_loop
    def get(self, name: str) -> Session | None:
        row = self._db.execute("SELECT key_digest, expires_at FROM dashboard_sessions WHERE name = ? "
                               "AND expires_at > ?", (name, time.time())).fetchone()
        return Session(str(row[0]), float(row[1])) if row is not None else None

    @off_loop
    def close(self, name: str) -> None:
        self._db.execute("DELETE FROM dashboard_sessions WHERE name = ?", (name,))


__all__ = ["SCHEMA", "SQLiteDashboardSessions"]
