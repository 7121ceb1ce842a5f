"""The embedded `Store`: SQLite in the data directory.

One connection per process, used from the event loop's thread: each call is a
short transaction, so a call is atomic with respect to every other, in this
process and in the others on the same file (the API process and its worker
processes). WAL mode lets readers (status polls) go on while a worker writes;
a writer waits for another's short transaction (`busy_timeout`). WAL with
synchronous=NORMAL survives a killed process (SIGKILL) without losing a
committed write; only a power cut could lose the last ones.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from gateway.json_codec import dumps, loads
from gateway.records import BatchStatus, Result, RouteStats, Shard, Usage
from gateway.store.base import BatchRecord, FileRecord, Page, RequestCounts

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, created_at INTEGER NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS files_owner ON files(owner, created_at, id);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, seq INTEGER NOT NULL,
    status TEXT NOT NULL, data TEXT NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_owner ON batches(owner, seq);
CREATE INDEX IF NOT EXISTS batches_status ON batches(status);
CREATE TABLE IF NOT EXISTS shards (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, route TEXT NOT NULL, size INTEGER NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, idx)
);
CREATE TABLE IF NOT EXISTS journal (
    batch_id TEXT NOT NULL, shard INTEGER NOT NULL, line INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS journal_shard ON journal(batch_id, shard);
CREATE TABLE IF NOT EXISTS route_stats (
    batch_id TEXT NOT NULL, route TEXT NOT NULL, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, route)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, data TEXT NOT NULL);
"""

_ACTIVE = tuple(s.value for s in BatchStatus if not s.finished)
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
    def __init__(self, path: Path) -> None:
        self._db = connect(path)
        self._db.executescript(_SCHEMA)

    # -- files ---------------------------------------------------------------

    async def put_file(self, rec: FileRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO files (id, owner, purpose, created_at, data) VALUES (?, ?, ?, ?, ?)",
            (rec.id, rec.owner, rec.purpose, rec.created_at, json.dumps(rec.to_json())),
        )

    async def get_file(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        row = self._db.execute("SELECT owner, data FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return FileRecord.from_json(json.loads(row[1]))

    async def list_files(
        self, owner: str, *, purpose: str | None, limit: int, order: str, after: str | None
    ) -> Page:
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

    async def delete_file(self, file_id: str, owner: str | None = None) -> bool:
        if owner is None:
            cur = self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        else:
            cur = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return cur.rowcount > 0

    async def expired_files(self, at: int, limit: int = 100) -> list[FileRecord]:
        rows = self._db.execute(
            "SELECT data FROM files WHERE json_extract(data, '$.expires_at') < ? "
            "ORDER BY json_extract(data, '$.expires_at') LIMIT ?", (at, limit)
        ).fetchall()
        return [FileRecord.from_json(json.loads(r[0])) for r in rows]

    # -- batches -------------------------------------------------------------

    async def put_batch(self, rec: BatchRecord) -> None:
        self._db.execute(
            "INSERT INTO batches (id, owner, created_at, seq, status, data) "
            "VALUES (?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM batches), ?, ?)",
            (rec.id, rec.owner, rec.created_at, rec.status.value, json.dumps(rec.to_json())),
        )

    def _row_to_batch(self, row: Sequence[Any]) -> BatchRecord:
        rec = BatchRecord.from_json(json.loads(row[0]))
        rec.counts = RequestCounts(total=rec.counts.total, completed=row[1], failed=row[2])
        rec.usage = Usage(input_tokens=row[3], output_tokens=row[4], cached_tokens=row[5], reasoning_tokens=row[6])
        return rec

    _BATCH_COLS = "data, completed, failed, input_tokens, output_tokens, cached_tokens, reasoning_tokens"

    async def get_batch(self, batch_id: str, owner: str | None = None) -> BatchRecord | None:
        row = self._db.execute(f"SELECT owner, {self._BATCH_COLS} FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return self._row_to_batch(row[1:])

    async def list_batches(self, owner: str, *, limit: int, after: str | None) -> Page:
        where, args = "owner = ?", [owner]
        if after:
            anchor = self._db.execute("SELECT seq FROM batches WHERE id = ? AND owner = ?", (after, owner)).fetchone()
            if anchor is not None:
                where += " AND seq < ?"
                args.append(anchor[0])
        rows = self._db.execute(
            f"SELECT {self._BATCH_COLS} FROM batches WHERE {where} ORDER BY seq DESC LIMIT ?", (*args, limit + 1)
        ).fetchall()
        return Page(data=[self._row_to_batch(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def update_batch(
        self, batch_id: str, fields: dict[str, Any], *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                self._db.execute("ROLLBACK")
                return False
            data = json.loads(row[0])
            if if_status is not None and BatchStatus(data["status"]) not in if_status:
                self._db.execute("ROLLBACK")
                return False
            for key, value in fields.items():
                data[key] = value.value if isinstance(value, BatchStatus) else value
            self._db.execute(
                "UPDATE batches SET data = ?, status = ? WHERE id = ?", (json.dumps(data), data["status"], batch_id)
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return True

    async def active_batches(self) -> list[BatchRecord]:
        marks = ",".join("?" * len(_ACTIVE))
        rows = self._db.execute(
            f"SELECT {self._BATCH_COLS} FROM batches WHERE status IN ({marks}) ORDER BY seq", _ACTIVE
        ).fetchall()
        return [self._row_to_batch(r) for r in rows]

    # -- shards --------------------------------------------------------------

    async def put_shards(self, batch_id: str, shards: Sequence[Shard]) -> None:
        self._db.executemany(
            "INSERT OR IGNORE INTO shards (batch_id, idx, route, size) VALUES (?, ?, ?, ?)",
            [(batch_id, s.index, s.route, s.size) for s in shards],
        )

    async def get_shards(self, batch_id: str) -> list[Shard]:
        return self._shards("SELECT idx, route, size FROM shards WHERE batch_id = ? ORDER BY idx", batch_id)

    async def unfinished_shards(self, batch_id: str) -> list[Shard]:
        return self._shards(
            "SELECT idx, route, size FROM shards WHERE batch_id = ? AND finished = 0 ORDER BY idx", batch_id
        )

    def _shards(self, sql: str, batch_id: str) -> list[Shard]:
        return [Shard(batch_id, i, r, n) for i, r, n in self._db.execute(sql, (batch_id,)).fetchall()]

    async def begin_attempt(self, shard: Shard) -> int:
        (count,) = self._db.execute(
            "UPDATE shards SET attempts = attempts + 1 WHERE batch_id = ? AND idx = ? RETURNING attempts",
            (shard.batch_id, shard.index),
        ).fetchone() or (1,)
        return int(count)

    async def finish_shard(self, shard: Shard) -> int:
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("UPDATE shards SET finished = 1 WHERE batch_id = ? AND idx = ?", (shard.batch_id, shard.index))
        (left,) = self._db.execute(
            "SELECT COUNT(*) FROM shards WHERE batch_id = ? AND finished = 0", (shard.batch_id,)
        ).fetchone()
        self._db.execute("COMMIT")
        return int(left)

    # -- journal -------------------------------------------------------------

    async def record_results(self, shard: Shard, results: Sequence[Result]) -> None:
        completed = failed = 0
        usage = Usage()
        route = RouteStats()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for r in results:
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO journal (batch_id, shard, line, data) VALUES (?, ?, ?, ?)",
                    (shard.batch_id, shard.index, r.line, dumps(r.to_json()).decode()),
                )
                if cur.rowcount != 1:
                    continue  # already recorded: counted once only
                route.add(r)
                if r.ok:
                    completed += 1
                    usage.add(r.usage)
                else:
                    failed += 1
            self._db.execute(
                "UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?, "
                "output_tokens = output_tokens + ?, cached_tokens = cached_tokens + ?, "
                "reasoning_tokens = reasoning_tokens + ? WHERE id = ?",
                (
                    completed, failed, usage.input_tokens, usage.output_tokens, usage.cached_tokens,
                    usage.reasoning_tokens, shard.batch_id,
                ),
            )
            if route.requests:
                self._db.execute(
                    "INSERT INTO route_stats (batch_id, route, completed, failed, input_tokens, output_tokens, "
                    "cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (batch_id, route) DO UPDATE SET "
                    "completed = completed + excluded.completed, failed = failed + excluded.failed, "
                    "input_tokens = input_tokens + excluded.input_tokens, "
                    "output_tokens = output_tokens + excluded.output_tokens, cost_usd = cost_usd + excluded.cost_usd",
                    (shard.batch_id, shard.route, route.completed, route.failed, route.input_tokens,
                     route.output_tokens, route.cost_usd),
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    async def journal(self, shard: Shard) -> list[Result]:
        rows = self._db.execute(
            "SELECT data FROM journal WHERE batch_id = ? AND shard = ?", (shard.batch_id, shard.index)
        ).fetchall()
        return [Result.from_json(loads(r[0])) for r in rows]

    async def recorded_lines(self, shard: Shard) -> set[int]:
        rows = self._db.execute(
            "SELECT line FROM journal WHERE batch_id = ? AND shard = ?", (shard.batch_id, shard.index)
        ).fetchall()
        return {r[0] for r in rows}

    async def drop_journal(self, shard: Shard) -> None:
        self._db.execute("DELETE FROM journal WHERE batch_id = ? AND shard = ?", (shard.batch_id, shard.index))

    async def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        rows = self._db.execute(
            "SELECT route, completed, failed, input_tokens, output_tokens, cost_usd FROM route_stats "
            "WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        return {r[0]: RouteStats(*r[1:]) for r in rows}

    # -- backend state -------------------------------------------------------

    async def put_meta(self, key: str, value: dict[str, Any]) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, data) VALUES (?, ?)", (key, json.dumps(value)))

    async def get_meta(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT data FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    async def delete_meta(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    async def aclose(self) -> None:
        self._db.close()
