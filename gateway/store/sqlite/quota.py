"""The embedded `QuotaLedger`: tables in the embedded SQLite file (see `gateway.store.sqlite.store`),
checked and written in one transaction. `team_spend` is written by `SQLiteLedger.record_results`, in the
transaction that journals the results; `team_reserved` holds what is reserved of it (`quota.fitting`)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from gateway.store.quota import TeamLimits, TeamUsage, exceeded, fitting
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_admissions (
    batch_id TEXT PRIMARY KEY, team TEXT NOT NULL, requests INTEGER NOT NULL, admitted_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS quota_team ON quota_admissions(team);
CREATE TABLE IF NOT EXISTS quota_models (
    batch_id TEXT NOT NULL, team TEXT NOT NULL, model TEXT NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (batch_id, model)
);
CREATE INDEX IF NOT EXISTS quota_models_team ON quota_models(team);
CREATE TABLE IF NOT EXISTS team_spend (
    team TEXT NOT NULL, period INTEGER NOT NULL, usd REAL NOT NULL, PRIMARY KEY (team, period)
);
CREATE TABLE IF NOT EXISTS team_reserved (
    team TEXT NOT NULL, holder TEXT NOT NULL, usd REAL NOT NULL, PRIMARY KEY (team, holder)
);
"""


class SQLiteQuotaLedger:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    def _usage(self, team: str) -> TeamUsage:
        n, total = self._db.execute("SELECT COUNT(*), COALESCE(SUM(requests), 0) FROM quota_admissions "
                                    "WHERE team = ?", (team,)).fetchone()
        models = self._db.execute("SELECT model, SUM(requests) FROM quota_models WHERE team = ? GROUP BY model",
                                  (team,)).fetchall()
        return TeamUsage(int(n), int(total), {str(m): int(r) for m, r in models})

    @off_loop
    def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits,
              by_model: Mapping[str, int] | None = None) -> str | None:
        by_model = by_model or {}
        with immediate(self._db):  # the check and the write under one lock: no two pass the last place
            refused = exceeded(self._usage(team), requests, by_model, limits)
            if refused is None:
                self._db.execute("INSERT OR REPLACE INTO quota_admissions VALUES (?, ?, ?, ?)",
                                 (batch_id, team, requests, time.time()))
                self._db.executemany("INSERT OR REPLACE INTO quota_models VALUES (?, ?, ?, ?)",
                                     [(batch_id, team, m, n) for m, n in by_model.items()])
        return refused

    @off_loop
    def usage(self, team: str) -> TeamUsage:
        return self._usage(team)

    @off_loop
    def admitted(self) -> dict[str, float]:
        return dict(self._db.execute("SELECT batch_id, admitted_at FROM quota_admissions").fetchall())

    @off_loop
    def release(self, batch_ids: Collection[str]) -> None:
        rows = [(b,) for b in batch_ids]
        with immediate(self._db):
            self._db.executemany("DELETE FROM quota_admissions WHERE batch_id = ?", rows)
            self._db.executemany("DELETE FROM quota_models WHERE batch_id = ?", rows)

    @off_loop
    def spend(self, team: str, period: int) -> float:
        row = self._db.execute("SELECT usd FROM team_spend WHERE team = ? AND period = ?", (team, period)).fetchone()
        return float(row[0]) if row else 0.0

    @off_loop
    def reserve(self, team: str, period: int, holder: str, costs: Sequence[float], limit: float) -> int:
        with immediate(self._db):  # the spend, the other holds and the new one under one lock
            row = self._db.execute("SELECT usd FROM team_spend WHERE team = ? AND period = ?",
                                   (team, period)).fetchone()
            (held,) = self._db.execute("SELECT COALESCE(SUM(usd), 0) FROM team_reserved WHERE team = ? AND holder != ?",
                                       (team, holder)).fetchone()
            room = float(limit) - (float(row[0]) if row else 0.0) - float(held)
            count, total = fitting(room, costs)
            if count:
                self._db.execute("INSERT OR REPLACE INTO team_reserved VALUES (?, ?, ?)", (team, holder, total))
            else:
                self._db.execute("DELETE FROM team_reserved WHERE team = ? AND holder = ?", (team, holder))
        return count

    @off_loop
    def shrink(self, team: str, holder: str, usd: float) -> None:
        with immediate(self._db):
            self._db.execute("UPDATE team_reserved SET usd = MAX(usd - ?, 0.0) WHERE team = ? AND holder = ?",
                             (usd, team, holder))

    @off_loop
    def unreserve(self, team: str, prefix: str) -> None:
        with immediate(self._db):
            self._db.execute("DELETE FROM team_reserved WHERE team = ? AND substr(holder, 1, ?) = ?",
                             (team, len(prefix), prefix))

    @off_loop
    def reserved(self, team: str) -> dict[str, float]:
        rows = self._db.execute("SELECT holder, usd FROM team_reserved WHERE team = ?", (team,)).fetchall()
        return {str(h): float(u) for h, u in rows}


__all__ = ["SCHEMA", "SQLiteQuotaLedger"]
