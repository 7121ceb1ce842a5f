"""The embedded `BackendState`: the `meta` table of the SQLite store (see `gateway.store.sqlite.store`)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, data TEXT NOT NULL);"


class SQLiteBackendState:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def put(self, key: str, value: dict[str, Any]) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, data) VALUES (?, ?)", (key, json.dumps(value)))

    async def get(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT data FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    async def delete(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key = ?", (key,))


__all__ = ["SCHEMA", "SQLiteBackendState"]
