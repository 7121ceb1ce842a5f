"""The embedded `BackendState`: the `meta` table of the SQLite store (see `gateway.store.sqlite.store`)."""

from __future__ import annotations

import json
from typing import Any

from gateway.store.sqlite.db import Database, off_loop

SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, data TEXT NOT NULL);"


class SQLiteBackendState:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def put(self, key: str, value: dict[str, Any]) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, data) VALUES (?, ?)", (key, json.dumps(value)))

    @off_loop
    def get(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT data FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    @off_loop
    def delete(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    @off_loop
    def scan(self, prefix: str) -> dict[str, dict[str, Any]]:
        # substr, not LIKE: a prefix's `_` and `%` are plain characters
        rows = self._db.execute("SELECT key, data FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix))
        return {key: json.loads(data) for key, data in rows.fetchall()}


__all__ = ["SCHEMA", "SQLiteBackendState"]
