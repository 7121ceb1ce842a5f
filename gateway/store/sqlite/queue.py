"""The embedded `Queue`: a table in the embedded SQLite file.

It lets the processes of one machine (the API process and its worker
processes, or `batchyard run` and its helpers) share shards through the same
file as the `SQLiteStore`, with no server; the heartbeats it checks are those
of the embedded `Coordination` (`gateway.store.sqlite.coordination`).

- `queue`: one row per shard carried, with its team, batch and deadline. `get`
  claims a row of the routes asked for that nobody holds, or that a worker holds
  whose heartbeat is gone, in one `BEGIN IMMEDIATE` transaction, so two
  processes never take one row (an idle poll only reads: it takes the write
  lock when there is a row to take). Which row: the fair pick
  (`gateway.scheduling.fairness`) between the first waiting shard of each batch, by the
  shards each (route, team) and each batch holds; within a batch, input order.
  `ack` deletes it. Nothing pushes: an idle `get` polls (every 20 ms at first,
  backing off to 200 ms), and a `put` in the same process wakes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any, cast

from gateway.domain import Shard
from gateway.scheduling.fairness import Candidate, pick
from gateway.store.records import Delivery
from gateway.store.sqlite import coordination
from gateway.store.sqlite.db import Database, immediate, off_loop

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, route TEXT NOT NULL, shard TEXT NOT NULL,
    consumer TEXT, claimed_at REAL, team TEXT NOT NULL DEFAULT '', batch TEXT NOT NULL DEFAULT '',
    deadline INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS queue_route ON queue(route, seq);
"""
_POLL_FIRST, _POLL_MAX = 0.02, 0.2


# Columns a queue table made before fair share lacks (a data dir from an older release).
_ADDED = {"team": "TEXT NOT NULL DEFAULT ''", "batch": "TEXT NOT NULL DEFAULT ''",
          "deadline": "INTEGER NOT NULL DEFAULT 0"}


def _ensure_schema(db: sqlite3.Connection) -> None:
    db.executescript(_SCHEMA)
    db.executescript(coordination.SCHEMA)  # a claim reads the workers' heartbeats
    have = {row[1] for row in db.execute("PRAGMA table_info(queue)").fetchall()}
    for name, kind in _ADDED.items():
        if name not in have:
            db.execute(f"ALTER TABLE queue ADD COLUMN {name} {kind}")


_INSERT = ("INTO queue (key, seq, route, shard, consumer, claimed_at, team, batch, deadline) "
           "VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM queue), ?, ?, NULL, NULL, ?, ?, ?)")


class SQLiteQueue:
    def __init__(self, path: Path, consumer: str, weights: Mapping[str, float] | None = None,
                 lane: Callable[[str], str] | None = None) -> None:
        self.sql = Database(path)
        # A shard's route -> the route a worker hosts it under (`Config.lane`: a wildcard route's concrete
        # models queue under its pattern); the row's `route` column is that lane.
        self._lane = lane or str
        self._db = self.sql.conn
        _ensure_schema(self._db)
        self.consumer = consumer
        self.weights = dict(weights or {})  # team -> weight (default 1)
        self._put_here = asyncio.Event()
        self.on_lost: Callable[[str], None] | None = None

    def _row(self, shard: Shard) -> tuple[Any, ...]:
        lane = self._lane(shard.route)
        return (shard.key, lane, json.dumps(shard.to_json()), shard.team, shard.batch_id, shard.deadline)

    async def put(self, shard: Shard) -> None:
        await self._insert("INSERT OR REPLACE", shard)
        self._put_here.set()

    async def put_missing(self, shard: Shard) -> bool:
        added = await self._insert("INSERT OR IGNORE", shard)
        self._put_here.set()
        return added

    @off_loop
    def _insert(self, verb: str, shard: Shard) -> bool:
        return self._db.execute(f"{verb} {_INSERT}", self._row(shard)).rowcount == 1

    def _claim(self, routes: Collection[str] | None, skip_teams: Collection[str],
               skip_batches: Collection[str]) -> Delivery | None:
        at = time.time()
        where, args = "", []
        if routes is not None:
            where = f" AND route IN ({','.join('?' * len(routes))})"
            args = list(routes)
        if skip_teams:
            where += f" AND team NOT IN ({','.join('?' * len(skip_teams))})"
            args += list(skip_teams)
        if skip_batches:
            where += f" AND batch NOT IN ({','.join('?' * len(skip_batches))})"
            args += list(skip_batches)
        free = ("(consumer IS NULL OR (consumer != ? AND consumer NOT IN "
                f"(SELECT name FROM workers WHERE expires_at > ?))){where}")
        if self._db.execute(f"SELECT 1 FROM queue WHERE {free} LIMIT 1", (self.consumer, at, *args)).fetchone() is None:
            return None  # nothing to take: an idle poll reads, and never holds the write lock
        with immediate(self._db):
            row = self._pick(free, (self.consumer, at, *args))  # again, under the lock
            if row is not None:
                self._db.execute("UPDATE queue SET consumer = ?, claimed_at = ? WHERE key = ?",
                                 (self.consumer, at, row[0]))
        return None if row is None else Delivery(shard=Shard.from_json(json.loads(row[1])), token=row[0])

    def _pick(self, free: str, args: tuple[Any, ...]) -> tuple[str, str] | None:
        """(key, shard JSON) of the row the fair pick gives: one candidate per waiting batch and route (its
        first shard in input order), weighed by the shards held per (route, team) and per batch."""
        # SQLite gives a bare column the values of the row MIN() chose: the batch's first waiting shard.
        rows = self._db.execute(
            f"SELECT key, shard, route, team, batch, deadline, MIN(seq) FROM queue WHERE {free} "
            "GROUP BY route, batch ORDER BY MIN(seq)", args).fetchall()
        held = self._db.execute("SELECT route, team, batch, COUNT(*) FROM queue WHERE consumer IS NOT NULL "
                                "GROUP BY route, team, batch").fetchall()
        team_used: Counter[tuple[str, str]] = Counter()
        batch_used: Counter[str] = Counter()
        for route, team, batch, n in held:
            team_used[route, team] += n
            batch_used[batch] += n
        candidates = [Candidate(team, batch, deadline, item=(key, shard), scope=route)
                      for key, shard, route, team, batch, deadline, _ in rows]
        chosen = pick(candidates, team_used, batch_used, self.weights)
        return None if chosen is None else cast(tuple[str, str], chosen.item)

    async def get(self, routes: Collection[str] | None, timeout: float, skip_teams: Collection[str] = (),
                  skip_batches: Collection[str] = ()) -> Delivery | None:
        if routes is not None and not routes:
            await asyncio.sleep(timeout)
            return None
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            self._put_here.clear()
            claim = asyncio.ensure_future(self.sql.run(partial(self._claim, routes, skip_teams, skip_batches)))
            try:
                delivery = await asyncio.shield(claim)
            except asyncio.CancelledError:
                claim.add_done_callback(self._hand_back_unseen)  # a shard claimed for no one: back at once
                raise
            if delivery is not None:
                return delivery
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(pause, left)):
                    await self._put_here.wait()
            pause = min(pause * 2, _POLL_MAX)

    def _hand_back_unseen(self, claim: asyncio.Future[Delivery | None]) -> None:
        if not claim.cancelled() and claim.exception() is None and (delivery := claim.result()) is not None:
            self.sql.later(partial(self._unclaim, delivery.token))

    @off_loop
    def ack(self, delivery: Delivery) -> None:
        self._db.execute("DELETE FROM queue WHERE key = ? AND consumer = ?", (delivery.token, self.consumer))

    @off_loop
    def hand_back(self, delivery: Delivery) -> None:
        self._unclaim(delivery.token)

    def _unclaim(self, key: str) -> None:
        self._db.execute("UPDATE queue SET consumer = NULL, claimed_at = NULL WHERE key = ? AND consumer = ?",
                         (key, self.consumer))

    @off_loop
    def release(self, consumer: str) -> int:
        """Hand back every shard `consumer` holds (it died: its supervisor saw it go)."""
        cur = self._db.execute("UPDATE queue SET consumer = NULL, claimed_at = NULL WHERE consumer = ?", (consumer,))
        return cur.rowcount

    @off_loop
    def queued(self) -> Collection[str]:
        return {r[0] for r in self._db.execute("SELECT key FROM queue").fetchall()}

    @off_loop
    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        waiting: dict[str, int] = {}
        held: dict[str, int] = {}
        rows = self._db.execute(
            "SELECT route, consumer IS NOT NULL, COUNT(*) FROM queue GROUP BY route, consumer IS NOT NULL"
        ).fetchall()
        for route, is_held, n in rows:
            (held if is_held else waiting)[route] = n
        return waiting, held

    async def depth(self) -> dict[str, int]:
        waiting, _ = await self.counts()
        return waiting

    async def tidy(self, alive: Collection[str]) -> None:
        return None  # a dead consumer's rows are taken by the next `get`; nothing else is left behind

    async def aclose(self) -> None:
        await self.sql.aclose()


__all__ = ["SQLiteQueue"]
