"""`immediate(db)`: one write transaction, as a table of what a block and its COMMIT do; `Database.run`: calls
run off the event loop, one at a time, in the order they were made."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from gateway.store.sqlite.db import Database, immediate


class _Full(sqlite3.OperationalError):
    pass


class Connection:
    """A stand-in for `sqlite3.Connection` that fails where it is told to: SQLite's own failures (a full disk
    at COMMIT) are hard to make on purpose."""

    def __init__(self, commit_fails: bool, rolls_back_itself: bool) -> None:
        self.statements: list[str] = []
        self.in_transaction = False
        self.commit_fails, self.rolls_back_itself = commit_fails, rolls_back_itself

    def execute(self, sql: str) -> None:
        self.statements.append(sql)
        if sql == "ROLLBACK" and not self.in_transaction:
            raise sqlite3.OperationalError("cannot rollback - no transaction is active")
        if sql == "COMMIT" and self.commit_fails:
            self.in_transaction = not self.rolls_back_itself  # SQLITE_FULL, SQLITE_IOERR: SQLite rolled back
            raise _Full("database or disk is full")
        self.in_transaction = sql == "BEGIN IMMEDIATE"


class _Boom(Exception):
    pass


@pytest.mark.parametrize(("block_raises", "commit_fails", "rolls_back_itself", "statements", "raised"), [
    (False, False, False, ["BEGIN IMMEDIATE", "COMMIT"], None),
    (True, False, False, ["BEGIN IMMEDIATE", "ROLLBACK"], _Boom),
    # COMMIT failed, the transaction still open (busy): rolled back, the COMMIT's error raised
    (False, True, False, ["BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"], _Full),
    # COMMIT failed and SQLite rolled back itself (full disk): no ROLLBACK, the COMMIT's error raised
    (False, True, True, ["BEGIN IMMEDIATE", "COMMIT"], _Full),
])
def test_immediate(block_raises: bool, commit_fails: bool, rolls_back_itself: bool, statements: list[str],
                   raised: type[Exception] | None) -> None:
    db = Connection(commit_fails, rolls_back_itself)
    try:
        with immediate(db):  # type: ignore[arg-type]
            if block_raises:
                raise _Boom
    except Exception as exc:
        assert raised is not None and type(exc) is raised
    else:
        assert raised is None
    assert db.statements == statements and not db.in_transaction


def test_immediate_keeps_nothing_of_a_block_that_raises(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "t.sqlite3", isolation_level=None)
    db.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(_Boom), immediate(db):
        db.execute("INSERT INTO t VALUES (1)")
        raise _Boom
    with immediate(db):
        db.execute("INSERT INTO t VALUES (2)")
    assert db.execute("SELECT x FROM t").fetchall() == [(2,)]


async def test_calls_run_off_the_loop_one_at_a_time_in_order(tmp_path: Path) -> None:
    sql = Database(tmp_path / "d.sqlite3")
    seen: list[tuple[int, str]] = []

    def call(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i

    try:
        got = await asyncio.gather(*(sql.run(lambda i=i: call(i)) for i in range(20)))
    finally:
        await sql.aclose()
    assert got == list(range(20)) and [i for i, _ in seen] == list(range(20))
    threads = {name for _, name in seen}
    assert len(threads) == 1 and threading.current_thread().name not in threads
