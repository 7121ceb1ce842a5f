"""The embedded `FileStore`: the `files` table of the SQLite store (see `gateway.store.sqlite.store`)."""

from __future__ import annotations

import json

from gateway.store.records import FileRecord, Page
from gateway.store.sqlite.db import Database, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, created_at INTEGER NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS files_owner ON files(owner, created_at, id);
"""


class SQLiteFiles:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def put(self, rec: FileRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO files (id, owner, purpose, created_at, data) VALUES (?, ?, ?, ?, ?)",
            (rec.id, rec.owner, rec.purpose, rec.created_at, json.dumps(rec.to_json())),
        )

    @off_loop
    def get(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        row = self._db.execute("SELECT owner, data FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return FileRecord.from_json(json.loads(row[1]))

    @off_loop
    def page(self, owner: str, *, purpose: str | None, limit: int, order: str, after: str | None) -> Page:
        where, args = ["owner = ?"], [owner]
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        if after:
            anchor = self._db.execute(
                "SELECT created_at FROM files WHERE id = ? AND owner = ?", (after, owner)
            ).fetchone()
            if anchor is not None:
                where.append(f"(created_at, id) {op} (?, ?)")
                args.extend([anchor[0], after])
        rows = self._db.execute(
            f"SELECT data FROM files WHERE {' AND '.join(where)} ORDER BY created_at {direction}, id {direction} "
            "LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        data = [FileRecord.from_json(json.loads(r[0])) for r in rows[:limit]]
        return Page(data=data, has_more=len(rows) > limit)

    @off_loop
    def delete(self, file_id: str, owner: str | None = None) -> bool:
        if owner is None:
            cur = self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        else:
            cur = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return cur.rowcount > 0

    @off_loop
    def expired(self, at: int, limit: int = 100) -> list[FileRecord]:
        rows = self._db.execute(
            "SELECT data FROM files WHERE json_extract(data, '$.expires_at') < ? "
            "ORDER BY json_extract(data, '$.expires_at') LIMIT ?", (at, limit)
        ).fetchall()
        return [FileRecord.from_json(json.loads(r[0])) for r in rows]

    async def tidy(self, at: float) -> int:
        return 0  # a record and its indexes are one row: no create is ever half done


__all__ = ["SCHEMA", "SQLiteFiles"]
