"""The embedded `BatchStore`: the `batches` table of the SQLite store (see `gateway.store.sqlite.store`).

A row keeps the record as JSON plus integer columns for the counters
(`completed`, `failed`, the token totals): those columns, which the ledger
moves as it records results, are the truth for `request_counts` and `usage`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from gateway.domain import BatchStatus, Usage
from gateway.store.records import BatchFields, BatchRecord, Page, RequestCounts, batch_fields
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, seq INTEGER NOT NULL,
    status TEXT NOT NULL, data TEXT NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_owner ON batches(owner, seq);
CREATE INDEX IF NOT EXISTS batches_status ON batches(status);
"""

_ACTIVE = tuple(s.value for s in BatchStatus if not s.finished)
_COLUMNS = "data, completed, failed, input_tokens, output_tokens, cached_tokens, reasoning_tokens"


def _row_to_batch(row: Sequence[Any]) -> BatchRecord:
    rec = BatchRecord.from_json(json.loads(row[0]))
    rec.counts = RequestCounts(total=rec.counts.total, completed=row[1], failed=row[2])
    rec.usage = Usage(input_tokens=row[3], output_tokens=row[4], cached_tokens=row[5], reasoning_tokens=row[6])
    return rec


class SQLiteBatches:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def put(self, rec: BatchRecord) -> None:
        self._db.execute(
            "INSERT INTO batches (id, owner, created_at, seq, status, data) "
            "VALUES (?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM batches), ?, ?)",
            (rec.id, rec.owner, rec.created_at, rec.status.value, json.dumps(rec.to_json())),
        )

    @off_loop
    def get(self, batch_id: str, owner: str | None = None) -> BatchRecord | None:
        row = self._db.execute(f"SELECT owner, {_COLUMNS} FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return _row_to_batch(row[1:])

    @off_loop
    def page(self, owner: str, *, limit: int, after: str | None, before: str | None = None,
             kind: str | None = None) -> Page:
        where, args = "owner = ?", [owner]
        if kind is not None:  # ids are `{kind}_{hex}`: `_` is LIKE's wildcard, escaped
            where += " AND id LIKE ? ESCAPE '\\'"
            args.append(f"{kind}\\_%")
        cursor, newer = (before, True) if before else (after, False)
        if cursor:
            anchor = self._db.execute("SELECT seq FROM batches WHERE id = ? AND owner = ?", (cursor, owner)).fetchone()
            if anchor is not None:
                where += " AND seq > ?" if newer else " AND seq < ?"
                args.append(anchor[0])
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM batches WHERE {where} ORDER BY seq {'ASC' if newer else 'DESC'} LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        kept = rows[:limit]
        if newer:  # the page just after the cursor, still listed newest first
            kept.reverse()
        return Page(data=[_row_to_batch(r) for r in kept], has_more=len(rows) > limit)

    @off_loop
    def update(
        self, batch_id: str, fields: BatchFields, *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        encoded = batch_fields(fields)
        with immediate(self._db):
            row = self._db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return False
            data = json.loads(row[0])
            if if_status is not None and BatchStatus(data["status"]) not in if_status:
                return False
            data.update(encoded)
            self._db.execute(
                "UPDATE batches SET data = ?, status = ? WHERE id = ?", (json.dumps(data), data["status"], batch_id)
            )
        return True

    @off_loop
    def delete(self, batch_id: str, owner: str) -> bool:
        marks = ",".join("?" * len(_ACTIVE))
        with immediate(self._db):
            gone = self._db.execute(f"DELETE FROM batches WHERE id = ? AND owner = ? AND status NOT IN ({marks})",
                                    (batch_id, owner, *_ACTIVE))
        return gone.rowcount > 0

    @off_loop
    def active(self) -> list[BatchRecord]:
        marks = ",".join("?" * len(_ACTIVE))
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM batches WHERE status IN ({marks}) ORDER BY seq", _ACTIVE
        ).fetchall()
        return [_row_to_batch(r) for r in rows]

    async def tidy(self, at: float) -> int:
        return 0  # a record and its indexes are one row: no create is ever half done


__all__ = ["SCHEMA", "SQLiteBatches"]
