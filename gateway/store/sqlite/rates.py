"""The embedded `RateWindows`: one row per (team, route, window) in the embedded SQLite file, taken in one
transaction (see `gateway.store.rates`)."""

from __future__ import annotations

from gateway.scheduling.pacing import Grant
from gateway.store.rates import DEFAULT_WINDOW_SECONDS, grantable, window_of
from gateway.store.sqlite.db import Database, immediate, off_loop

SCHEMA = """
CREATE TABLE IF NOT EXISTS rate_windows (
    team TEXT NOT NULL, route TEXT NOT NULL, window INTEGER NOT NULL, requests INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (team, route, window)
);
"""


class SQLiteRates:
    def __init__(self, sql: Database, window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self.sql, self._db = sql, sql.conn
        self.window_seconds = window_seconds

    def _row(self, team: str, route: str, window: int) -> tuple[int, int]:
        row = self._db.execute("SELECT requests, tokens FROM rate_windows WHERE team = ? AND route = ? AND "
                               "window = ?", (team, route, window)).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    @off_loop
    def take(self, team: str, route: str, want: int, rpm: int | None, tpm: int | None,
             estimate: int = 0) -> Grant:
        window, left = window_of(self.window_seconds)
        with immediate(self._db):  # the check and the count under one lock, across processes
            self._db.execute("DELETE FROM rate_windows WHERE team = ? AND route = ? AND window < ?",
                             (team, route, window))
            requests, tokens = self._row(team, route, window)
            granted = grantable(want, requests, tokens, rpm, tpm, estimate)
            if granted:
                self._db.execute("INSERT INTO rate_windows (team, route, window, requests, tokens) VALUES "
                                 "(?, ?, ?, ?, ?) ON CONFLICT (team, route, window) DO UPDATE SET requests = "
                                 "requests + excluded.requests, tokens = tokens + excluded.tokens",
                                 (team, route, window, granted, granted * estimate))
        return Grant(granted, left)

    @off_loop
    def add_tokens(self, team: str, route: str, tokens: int) -> None:
        if tokens:
            window, _ = window_of(self.window_seconds)
            self._db.execute("INSERT INTO rate_windows (team, route, window, tokens) VALUES (?, ?, ?, ?) "
                             "ON CONFLICT (team, route, window) DO UPDATE SET tokens = tokens + excluded.tokens",
                             (team, route, window, tokens))

    @off_loop
    def used(self, team: str, route: str) -> tuple[int, int]:
        return self._row(team, route, window_of(self.window_seconds)[0])


__all__ = ["SCHEMA", "SQLiteRates"]
