"""The embedded `QuotaLedger`: a table in the embedded SQLite file, checked and written in one transaction."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

from gateway.store.quota import TeamLimits, TeamUsage, exceeded
from gateway.store.sqlite_store import connect

_SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_admissions (
    batch_id TEXT PRIMARY KEY, team TEXT NOT NULL, requests INTEGER NOT NULL, admitted_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS quota_team ON quota_admissions(team);
CREATE TABLE IF NOT EXISTS team_spend (
    team TEXT NOT NULL, period INTEGER NOT NULL, usd REAL NOT NULL, PRIMARY KEY (team, period)
);
"""


class SQLiteQuotaLedger:
    def __init__(self, path: Path) -> None:
        self._db = connect(path)
        self._db.executescript(_SCHEMA)

    def _usage(self, team: str) -> TeamUsage:
        n, total = self._db.execute("SELECT COUNT(*), COALESCE(SUM(requests), 0) FROM quota_admissions "
                                    "WHERE team = ?", (team,)).fetchone()
        return TeamUsage(int(n), int(total))

    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits) -> str | None:
        self._db.execute("BEGIN IMMEDIATE")  # the check and the write under one lock: no two pass the last place
        try:
            refused = exceeded(self._usage(team), requests, limits)
            if refused is None:
                self._db.execute("INSERT OR REPLACE INTO quota_admissions VALUES (?, ?, ?, ?)",
                                 (batch_id, team, requests, time.time()))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return refused

    async def usage(self, team: str) -> TeamUsage:
        return self._usage(team)

    async def admitted(self) -> dict[str, float]:
        return dict(self._db.execute("SELECT batch_id, admitted_at FROM quota_admissions").fetchall())

    async def release(self, batch_ids: Collection[str]) -> None:
        self._db.executemany("DELETE FROM quota_admissions WHERE batch_id = ?", [(b,) for b in batch_ids])

    async def add_spend(self, team: str, period: int, usd: float) -> None:
        self._db.execute("INSERT INTO team_spend VALUES (?, ?, ?) ON CONFLICT (team, period) DO UPDATE SET "
                         "usd = usd + excluded.usd", (team, period, usd))

    async def spend(self, team: str, period: int) -> float:
        row = self._db.execute("SELECT usd FROM team_spend WHERE team = ? AND period = ?", (team, period)).fetchone()
        return float(row[0]) if row else 0.0

    async def aclose(self) -> None:
        self._db.close()


__all__ = ["SQLiteQuotaLedger"]
