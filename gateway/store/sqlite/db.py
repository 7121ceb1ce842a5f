"""The embedded database's connection, the one thread that uses it, and its transactions.

- `connect`: a connection as every part opens one (WAL cut back to `WAL_LIMIT_BYTES` at each restart,
  `busy_timeout`; see `gateway.store.sqlite.store`).
- `Database`: a connection and the one thread its calls run in, off the event loop. A call that waits for
  another process's write lock (up to `busy_timeout`), or reads a shard's journal (thousands of rows), no
  longer stalls every request the loop serves meanwhile: the sqlite3 module lets go of the GIL while SQLite
  works. One thread per connection runs its calls one at a time, in the order they were made, so each
  call is still atomic with respect to the others of its process, as it was on the loop.
- `off_loop`: a part's method, written as plain (blocking) code, made an `async` one that runs there.
- `immediate`: one write transaction (`BEGIN IMMEDIATE`: the write lock first, so the reads in it see what
  the write acts on).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

BUSY_TIMEOUT_MS = 30_000
WAL_LIMIT_BYTES = 8 * 1024 * 1024

P = ParamSpec("P")
R = TypeVar("R")


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the embedded database, as every part that shares it opens one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    # The WAL file keeps its largest size unless told: each time a checkpoint lets it begin again, it is cut
    # back to this (a batch's burst of results grew it to the size of the results, for good).
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    return db


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`with immediate(db):` the block is one write transaction: committed when it ends, rolled back if it
    raises. A COMMIT that fails may leave no transaction behind (SQLite rolls back itself on a full disk or
    an I/O error): then there is nothing to roll back, and the COMMIT's own error is the one raised."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


class Database:
    """A connection and the one thread that runs its calls (`run`), off the event loop."""

    def __init__(self, path: Path) -> None:
        self.conn = connect(path)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{path.name}")

    async def run(self, call: Callable[[], R]) -> R:
        """`call()` in the connection's thread; the caller's loop serves others meanwhile. A caller cancelled
        while its call runs does not stop it (a transaction is all or nothing either way)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    def later(self, call: Callable[[], object]) -> None:
        """`call()` in the connection's thread after those already asked for; nobody waits for it."""
        self._thread.submit(call)

    async def aclose(self) -> None:
        await self.run(self.conn.close)
        self._thread.shutdown(wait=False)


class OnThread(Protocol):
    """A part whose methods `off_loop` runs: it names the `Database` its connection belongs to."""

    @property
    def sql(self) -> Database: ...


S = TypeVar("S", bound=OnThread)


def off_loop(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The method, blocking as written, as an `async` method that runs it in its part's database thread."""

    @functools.wraps(method)
    async def call(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self.sql.run(functools.partial(method, self, *args, **kwargs))

    return call


__all__ = ["BUSY_TIMEOUT_MS", "WAL_LIMIT_BYTES", "Database", "OnThread", "connect", "immediate", "off_loop"]
