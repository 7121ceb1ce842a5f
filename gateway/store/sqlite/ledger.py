"""The embedded `ShardLedger`: the `shards`, `journal` and `route_stats` tables of the SQLite store
(see `gateway.store.sqlite.store`), and the log a batch's results are read from while it runs, by seq: the
unsealed shards' results (`results_seq`: each journaled line's seq; its result is the journal's row, not a
second copy); a sealed shard's are in its results blob, its span of seqs in `sealed_seqs`.

`record_results` is one transaction over the journal, the batch's counter
columns (in `batches`, see `gateway.store.sqlite.batches`), the route stats and
the team's spend (`team_spend`, see `gateway.store.sqlite.quota`): a line's
result is counted only when its journal row is new. Once a shard is `sealed`
(`drop_journal`: its results are in a blob; `record_answered`), results for it
are ignored, as in Redis: a shard run twice never counts a line twice.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.domain import Result, RouteStats, Shard, Usage, billable
from gateway.json_codec import dumps, loads
from gateway.store.quota import SpendTo
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS shards (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, route TEXT NOT NULL, size INTEGER NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, idx)
);
CREATE TABLE IF NOT EXISTS journal (
    batch_id TEXT NOT NULL, shard INTEGER NOT NULL, line INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS journal_shard ON journal(batch_id, shard);
CREATE TABLE IF NOT EXISTS sealed (batch_id TEXT NOT NULL, shard INTEGER NOT NULL, PRIMARY KEY (batch_id, shard));
CREATE TABLE IF NOT EXISTS results_seq (
    batch_id TEXT NOT NULL, seq INTEGER NOT NULL, line INTEGER NOT NULL, PRIMARY KEY (batch_id, seq)
);
CREATE TABLE IF NOT EXISTS sealed_seqs (
    batch_id TEXT NOT NULL, shard INTEGER NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
    PRIMARY KEY (batch_id, shard)
);
CREATE TABLE IF NOT EXISTS route_stats (
    batch_id TEXT NOT NULL, route TEXT NOT NULL, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0, reruns INTEGER NOT NULL DEFAULT 0,
    output_invalid INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, route)
);
"""
# Columns a route_stats table made before the output check lacks (a data dir from an older release).
_ADDED = ("reruns", "output_invalid")


class SQLiteLedger:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn
        have = {row[1] for row in self._db.execute("PRAGMA table_info(route_stats)").fetchall()}
        for name in _ADDED:
            if name not in have:
                try:
                    self._db.execute(f"ALTER TABLE route_stats ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")
                except sqlite3.OperationalError as exc:  # another process opening the same data dir added it
                    if "duplicate column" not in str(exc):
                        raise
        with immediate(self._db):  # a data dir from an older release logged each result twice: once is kept
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'results_log'").fetchone():
                self._db.execute("INSERT OR IGNORE INTO results_seq SELECT batch_id, seq, json_extract(data, '$.line') "
                                 "FROM results_log")
                self._db.execute("DROP TABLE results_log")

    # -- shards --------------------------------------------------------------

    @off_loop
    def put_shards(self, batch_id: str, shards: Sequence[Shard]) -> None:
        self._db.executemany(
            "INSERT OR IGNORE INTO shards (batch_id, idx, route, size) VALUES (?, ?, ?, ?)",
            [(batch_id, s.index, s.route, s.size) for s in shards],
        )

    @off_loop
    def get_shards(self, batch_id: str) -> list[Shard]:
        return self._shards("SELECT idx, route, size FROM shards WHERE batch_id = ? ORDER BY idx", batch_id)

    @off_loop
    def unfinished_shards(self, batch_id: str) -> list[Shard]:
        return self._shards(
            "SELECT idx, route, size FROM shards WHERE batch_id = ? AND finished = 0 ORDER BY idx", batch_id
        )

    def _shards(self, sql: str, batch_id: str) -> list[Shard]:
        return [Shard(batch_id, i, r, n) for i, r, n in self._db.execute(sql, (batch_id,)).fetchall()]

    @off_loop
    def begin_attempt(self, shard: Shard) -> int:
        (count,) = self._db.execute(
            "UPDATE shards SET attempts = attempts + 1 WHERE batch_id = ? AND idx = ? RETURNING attempts",
            (shard.batch_id, shard.index),
        ).fetchone() or (1,)
        return int(count)

    @off_loop
    def return_attempt(self, shard: Shard) -> int:
        (count,) = self._db.execute(
            "UPDATE shards SET attempts = attempts - 1 WHERE batch_id = ? AND idx = ? AND attempts > 0 "
            "RETURNING attempts",
            (shard.batch_id, shard.index),
        ).fetchone() or (0,)
        return int(count)

    @off_loop
    def finish_shard(self, shard: Shard) -> int:
        with immediate(self._db):
            self._db.execute("UPDATE shards SET finished = 1 WHERE batch_id = ? AND idx = ?",
                             (shard.batch_id, shard.index))
            (left,) = self._db.execute(
                "SELECT COUNT(*) FROM shards WHERE batch_id = ? AND finished = 0", (shard.batch_id,)
            ).fetchone()
        return int(left)

    # -- journal -------------------------------------------------------------

    @off_loop
    def record_results(self, shard: Shard, results: Sequence[Result], spend: SpendTo | None = None) -> None:
        completed = failed = 0
        usage = Usage()
        route = RouteStats()
        with immediate(self._db):
            if self._sealed(shard):
                return  # its results are in a blob: nothing is left to dedupe a late one against
            # The log keeps only unsealed shards' results, so the last seq is the larger of its own and the
            # sealed shards' spans: a seq is never given twice.
            (seq,) = self._db.execute(
                "SELECT MAX(COALESCE((SELECT MAX(seq) FROM results_seq WHERE batch_id = ?1), 0), "
                "COALESCE((SELECT MAX(last_seq) FROM sealed_seqs WHERE batch_id = ?1), 0))", (shard.batch_id,),
            ).fetchone()
            for r in results:
                row = r.to_json()
                row["seq"] = seq + 1
                data = dumps(row).decode()
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO journal (batch_id, shard, line, data) VALUES (?, ?, ?, ?)",
                    (shard.batch_id, shard.index, r.line, data),
                )
                if cur.rowcount != 1:
                    continue  # already recorded: counted once only
                seq += 1
                self._db.execute("INSERT INTO results_seq (batch_id, seq, line) VALUES (?, ?, ?)",
                                 (shard.batch_id, seq, r.line))
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
                    "cost_usd, reruns, output_invalid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (batch_id, route) DO UPDATE SET "
                    "completed = completed + excluded.completed, failed = failed + excluded.failed, "
                    "input_tokens = input_tokens + excluded.input_tokens, "
                    "output_tokens = output_tokens + excluded.output_tokens, cost_usd = cost_usd + excluded.cost_usd, "
                    "reruns = reruns + excluded.reruns, output_invalid = output_invalid + excluded.output_invalid",
                    (shard.batch_id, shard.route, route.completed, route.failed, route.input_tokens,
                     route.output_tokens, route.cost_usd, route.reruns, route.output_invalid),
                )
            # The cost of the lines journaled now, with them. `RouteStats.add` summed only `billable` costs; the
            # MAX is the last word: a spend never falls within its period, whatever a result says it cost.
            if spend is not None and billable(route.cost_usd):
                self._db.execute("INSERT INTO team_spend VALUES (?, ?, ?) ON CONFLICT (team, period) DO UPDATE SET "
                                 "usd = usd + MAX(excluded.usd, 0)", (spend.team, spend.period, route.cost_usd))

    @off_loop
    def record_answered(self, shard: Shard, count: int) -> None:
        if count <= 0:
            return
        with immediate(self._db):
            # Once per shard: the first call seals it, a later one (or one after `drop_journal`) counts nothing.
            # Before the `sealed` table the mark was the shard's attempts (-1: a shard of answered lines is
            # never run): a data directory from then keeps its marks.
            sealed_now = self._db.execute("INSERT OR IGNORE INTO sealed (batch_id, shard) VALUES (?, ?)",
                                          (shard.batch_id, shard.index)).rowcount == 1
            unmarked = self._db.execute(
                "UPDATE shards SET attempts = -1 WHERE batch_id = ? AND idx = ? AND attempts = 0 RETURNING idx",
                (shard.batch_id, shard.index),
            ).fetchone() is not None
            if sealed_now and unmarked:
                self._db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (count, shard.batch_id))
                self._db.execute(
                    "INSERT INTO route_stats (batch_id, route, failed) VALUES (?, ?, ?) "
                    "ON CONFLICT (batch_id, route) DO UPDATE SET failed = failed + excluded.failed",
                    (shard.batch_id, shard.route, count),
                )

    @off_loop
    def journal(self, shard: Shard) -> list[Result]:
        rows = self._db.execute(
            "SELECT data FROM journal WHERE batch_id = ? AND shard = ?", (shard.batch_id, shard.index)
        ).fetchall()
        return [Result.from_json(loads(r[0])) for r in rows]

    @off_loop
    def recorded_lines(self, shard: Shard) -> set[int]:
        rows = self._db.execute(
            "SELECT line FROM journal WHERE batch_id = ? AND shard = ?", (shard.batch_id, shard.index)
        ).fetchall()
        return {r[0] for r in rows}

    @off_loop
    def drop_journal(self, shard: Shard) -> None:
        # The shard is sealed: a result that comes later (the same shard run twice, by a worker taken
        # for dead) must not count again, though no journal is left to dedupe it (as in Redis).
        # Its results leave the log too (they are in the shard's results blob, with their seq): the store holds
        # only the unsealed shards' results, never a whole batch's. Its span of seqs says where to find them.
        with immediate(self._db):
            b, i = shard.batch_id, shard.index
            span = self._db.execute(
                "SELECT MIN(json_extract(data, '$.seq')), MAX(json_extract(data, '$.seq')) FROM journal "
                "WHERE batch_id = ? AND shard = ?", (b, i),
            ).fetchone()
            if span is not None and span[0] is not None:
                self._db.execute(
                    "DELETE FROM results_seq WHERE batch_id = ?1 AND seq IN "
                    "(SELECT json_extract(data, '$.seq') FROM journal WHERE batch_id = ?1 AND shard = ?2)", (b, i),
                )
                self._db.execute("INSERT OR IGNORE INTO sealed_seqs VALUES (?, ?, ?, ?)", (b, i, span[0], span[1]))
            self._db.execute("DELETE FROM journal WHERE batch_id = ? AND shard = ?", (b, i))
            self._seal(shard)

    def _seal(self, shard: Shard) -> None:
        self._db.execute("INSERT OR IGNORE INTO sealed (batch_id, shard) VALUES (?, ?)", (shard.batch_id, shard.index))

    def _sealed(self, shard: Shard) -> bool:
        return self._db.execute("SELECT 1 FROM sealed WHERE batch_id = ? AND shard = ?",
                                (shard.batch_id, shard.index)).fetchone() is not None

    @off_loop
    def logged(self, batch_id: str, after: int, limit: int) -> list[Result]:
        rows = self._db.execute(
            "SELECT j.data FROM results_seq AS s JOIN journal AS j ON j.batch_id = s.batch_id AND j.line = s.line "
            "WHERE s.batch_id = ? AND s.seq > ? ORDER BY s.seq LIMIT ?", (batch_id, after, limit)
        ).fetchall()
        return [Result.from_json(loads(r[0])) for r in rows]

    @off_loop
    def sealed_seqs(self, batch_id: str) -> dict[int, tuple[int, int]]:
        rows = self._db.execute("SELECT shard, first_seq, last_seq FROM sealed_seqs WHERE batch_id = ?",
                                (batch_id,)).fetchall()
        return {int(i): (int(lo), int(hi)) for i, lo, hi in rows}

    async def settle_spend(self, batch_id: str) -> None:
        return None  # record_results moved it in its own transaction

    @off_loop
    def drop_log(self, batch_id: str) -> None:
        with immediate(self._db):
            self._db.execute("DELETE FROM results_seq WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM sealed_seqs WHERE batch_id = ?", (batch_id,))

    @off_loop
    def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        rows = self._db.execute(
            "SELECT route, completed, failed, input_tokens, output_tokens, cost_usd, reruns, output_invalid "
            "FROM route_stats "
            "WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        return {r[0]: RouteStats(*r[1:]) for r in rows}


__all__ = ["SCHEMA", "SQLiteLedger"]
