"""The embedded `IdempotencyKeys` (`gateway.store.idempotency`): a table in the embedded SQLite file, one row per
team and key, reserved, completed and released in single transactions."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.store.idempotency import KEY_TTL_SECONDS, IdempotencyEntry
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    team TEXT NOT NULL, key TEXT NOT NULL, token TEXT NOT NULL, expires_at REAL NOT NULL, data TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (team, key)
);
CREATE INDEX IF NOT EXISTS idempotency_expiry ON idempotency_keys(expires_at);
"""


class SQLiteIdempotencyKeys:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def reserve(self, team: str, key: str, token: str, fingerprint: str, hold: float) -> IdempotencyEntry | None:
        t = time.time()
        with immediate(self._db):  # the look and the insert under one lock: one of two racing requests reserves
            # Lapsed entries go here, every team's (the index makes it cheap): nothing else sweeps the table.
            self._db.execute("DELETE FROM idempotency_keys WHERE expires_at <= ?", (t,))
            row = self._db.execute("SELECT data FROM idempotency_keys WHERE team = ? AND key = ?",
                                   (team, key)).fetchone()
            if row is not None:
                return IdempotencyEntry.from_json(json.loads(row[0]))
            entry = IdempotencyEntry(token, fingerprint, t)
            self._db.execute("INSERT INTO idempotency_keys (team, key, token, expires_at, data) VALUES (?, ?, ?, ?, ?)",
                             (team, key, token, t + hold, json.dumps(entry.to_json())))
        return None

    @off_loop
    def complete(self, team: str, key: str, token: str, fingerprint: str, result: dict[str, Any]) -> bool:
        with immediate(self._db):
            row = self._db.execute("SELECT data FROM idempotency_keys WHERE team = ? AND key = ? AND token = ? "
                                   "AND done = 0 AND expires_at > ?", (team, key, token, time.time())).fetchone()
            if row is None:
                return False
            first = IdempotencyEntry.from_json(json.loads(row[0]))
            entry = IdempotencyEntry(token, fingerprint, first.created_at, result)
            kept_until = first.created_at + KEY_TTL_SECONDS
            self._db.execute("UPDATE idempotency_keys SET done = 1, expires_at = ?, data = ? "
                             "WHERE team = ? AND key = ?", (kept_until, json.dumps(entry.to_json()), team, key))
        return True

    @off_loop
    def release(self, team: str, key: str, token: str) -> None:
        self._db.execute("DELETE FROM idempotency_keys WHERE team = ? AND key = ? AND token = ? AND done = 0",
                         (team, key, token))


__all__ = ["SCHEMA", "SQLiteIdempotencyKeys"]
