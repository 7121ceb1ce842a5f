"""Faults of the machine, told apart from faults of the work, in one place.

A fault of the machine is the storage's, never the team's: a full disk or an I/O error (a file, SQLite),
a database locked past its timeout, Redis unreachable, S3 throttling, failing (5xx) or unreachable. The
shard runner hands such a shard back without spending an attempt and pauses (`Pause`); the API answers
503 instead of a traceback. Everything else (an upstream's reply, a bad line, a bug) is a fault of the work
and keeps its attempt and its traceback.

`machine_fault(exc)` looks through the exception's causes and groups, since a fault often arrives
wrapped (an `ExceptionGroup` of a task group, a `raise … from` of a store).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("batchyard.faults")

# kind (one of metrics' FAULT_KINDS) -> (what is down, the words of the log line and the dashboard)
KINDS: dict[str, tuple[str, str]] = {
    "disk_full": ("storage", "disk full"),
    "disk_io_error": ("storage", "disk I/O error"),
    "read_only": ("storage", "read-only filesystem"),
    "database_locked": ("storage", "database locked"),
    "redis_unreachable": ("Redis", "unreachable"),
    "s3_unavailable": ("S3", "throttled or 5xx"),
    "s3_unreachable": ("S3", "unreachable"),
}
_ERRNO_KINDS = {errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full", errno.EIO: "disk_io_error",
                errno.EROFS: "read_only"}
# SQLite's primary result codes (the low byte of an extended one)
_SQLITE_KINDS = {13: "disk_full", 10: "disk_io_error", 8: "read_only", 5: "database_locked", 6: "database_locked"}
_SQLITE_WORDS = {"database or disk is full": "disk_full", "disk i/o error": "disk_io_error",
                 "database is locked": "database_locked", "readonly database": "read_only"}
# S3's codes for "slow down / try again", whatever the HTTP status says
_REDIS_CONNECTION = os.path.join("redis", "asyncio", "connection.py")
_S3_RETRY_CODES = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling",
                   "ThrottlingException", "RequestLimitExceeded", "503"}


class CarriedFault(RuntimeError):
    """A fault of the machine carried as plain words across a process boundary (a validation process's
    answer), where the original exception may not pickle."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True, slots=True)
class MachineFault:
    kind: str  # a key of KINDS, the metrics' label
    detail: str  # the exception's own words

    @property
    def service(self) -> str:
        return KINDS[self.kind][0]

    @property
    def words(self) -> str:
        return KINDS[self.kind][1]


def _kind(exc: BaseException) -> str | None:
    if isinstance(exc, CarriedFault):
        return exc.kind if exc.kind in KINDS else None
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and (code & 0xFF) in _SQLITE_KINDS:
            return _SQLITE_KINDS[code & 0xFF]
        text = str(exc).lower()
        return next((kind for words, kind in _SQLITE_WORDS.items() if words in text), None)
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KINDS:
        return _ERRNO_KINDS[exc.errno]
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | BusyLoadingError):
        return "redis_unreachable"
    # a failover under way: a cluster without a master for some slots, a replica not yet promoted
    if isinstance(exc, ClusterDownError | TryAgainError | ReadOnlyError | SlotNotCoveredError):
        return "redis_unreachable"
    if isinstance(exc, ResponseError) and str(exc).startswith(("MISCONF", "OOM", "LOADING")):
        return "redis_unreachable"  # Redis up but refusing writes: its disk or memory is full
    if isinstance(exc, AttributeError | TypeError) and _in_redis_connection(exc):
        return "redis_unreachable"  # a connection closed under a command (redis-py #4287)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if status >= 500 or str(error.get("Code")) in _S3_RETRY_CODES:
            return "s3_unavailable"
        return None
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return "s3_unreachable"
    return None


def _in_redis_connection(exc: BaseException) -> bool:
    """Whether `exc` came out of redis-py's asyncio connection: a command written to a connection that was
    closed meanwhile (a cluster's failover resets its nodes' connections, a peer resets one) meets a
    transport torn down under it and raises `'NoneType' object has no attribute 'writelines'` (or a
    TypeError) instead of a ConnectionError (redis-py 8.1.0, issue #4287; seen in the 3+3 failover test)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(_REDIS_CONNECTION):
            return True
        tb = tb.tb_next
    return False


def machine_fault(exc: BaseException) -> MachineFault | None:
    """The fault of the machine behind `exc` (itself, a cause, or every member of a group), else None."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            found = [machine_fault(e) for e in current.exceptions]
            # A group is the machine's only when each of its members is: one work fault keeps its attempt.
            if found and all(found):
                return found[0]
            continue
        kind = _kind(current)
        if kind is not None:
            return MachineFault(kind, str(current) or type(current).__name__)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


_SAID: dict[str, float] = {}  # kind -> monotonic time of its last line (`once_a_minute`)


def once_a_minute(kind: str, every: float = 60.0) -> bool:
    """Whether a line about this kind of fault is due in this process (one per kind and minute)."""
    now = time.monotonic()
    if now - _SAID.get(kind, -every) < every:
        return False
    _SAID[kind] = now
    return True


# kind -> (wall-clock time first met, monotonic time last met): what this process has met lately, for the
# dashboard's "waiting: disk full since 10:02" (the heartbeat carries it to the API of another process).
_NOTICED: dict[str, tuple[float, float]] = {}
NOTICE_FRESH_SECONDS = 90.0  # a fault not met again for this long is taken as cleared (the back-off is ≤ 30 s)


def notice(kind: str) -> None:
    since = _NOTICED.get(kind, (time.time(), 0.0))[0]
    _NOTICED[kind] = (since, time.monotonic())


def forget(kinds: Iterable[str]) -> None:
    for kind in list(kinds):
        _NOTICED.pop(kind, None)


def noticed() -> dict[str, float]:
    """The faults of the machine this process met lately: kind -> since (unix time)."""
    now = time.monotonic()
    for kind, (_, last) in list(_NOTICED.items()):
        if now - last > NOTICE_FRESH_SECONDS:
            del _NOTICED[kind]
    return {kind: since for kind, (since, _) in _NOTICED.items()}


def waiting_words(faults: Mapping[str, float]) -> str | None:
    """`faults` (kind -> since) as the dashboard says it: "waiting: disk full since 10:02 UTC"."""
    if not faults:
        return None
    parts = [f"{KINDS[k][0] if KINDS[k][0] != 'storage' else ''} {KINDS[k][1]}".strip() + " since "
             + time.strftime("%H:%M UTC", time.gmtime(since))
             for k, since in sorted(faults.items(), key=lambda kv: kv[1]) if k in KINDS]
    return "waiting: " + ", ".join(parts) if parts else None


class Pause:
    """A shard runner's back-off after faults of the machine: exponential, from `first` to `ceiling` seconds,
    reset by the first success. One log line per kind and `log_every` seconds, not one per shard, and the
    `batchyard_paused{reason}` gauge while it lasts."""

    def __init__(self, first: float = 1.0, ceiling: float = 30.0, log_every: float = 60.0, *,
                 count: Callable[[str], None] | None = None, show: Callable[[str, bool], None] | None = None) -> None:
        self.first, self.ceiling, self.log_every = first, ceiling, log_every
        # Where each fault is counted and a pause is shown (the runner hands in its metrics: the store
        # imports none).
        self._count = count or (lambda kind: None)
        self._show = show or (lambda kind, paused: None)
        self.failures = 0
        self.until = 0.0  # monotonic time before which the runner takes no shard
        self.since: dict[str, float] = {}  # kind -> wall-clock time the fault was first met
        self.last_fault = 0.0  # monotonic time of the last fault met
        self._logged: dict[str, float] = {}  # kind -> monotonic time of its last log line

    @property
    def paused(self) -> bool:
        return bool(self.since)

    def fault(self, fault: MachineFault) -> float:
        """A shard met `fault`: back off (returns the delay, seconds) and say so, at most once a minute."""
        now = time.monotonic()
        # One step of the back-off per try after a wait, not per shard: the twenty shards in flight when the disk
        # filled would otherwise take it to the ceiling at once (a 5 s outage then took 27 s to recover from).
        if now >= self.until:
            self.failures += 1
        delay = min(self.first * 2 ** (max(self.failures, 1) - 1), self.ceiling)
        self.until = max(self.until, now + delay)
        self.last_fault = now
        self._count(fault.kind)
        notice(fault.kind)
        if fault.kind not in self.since:
            self.since[fault.kind] = time.time()
            self._show(fault.kind, True)
        if now - self._logged.get(fault.kind, -self.log_every) >= self.log_every:
            self._logged[fault.kind] = now
            log.warning("%s unavailable (%s: %s); pausing, retry in %d s",
                        fault.service, fault.words, fault.detail, round(delay))
        return delay

    def succeeded(self, started: float) -> None:
        """A shard taken at `started` (monotonic) ran without a fault: if it was taken after the last fault,
        the pause is over (a shard that began before it proves nothing about the machine now)."""
        if started < self.last_fault:
            return
        self.failures = 0
        if not self.since:
            return
        now = time.time()
        for kind, since in self.since.items():
            service, words = KINDS[kind]
            log.warning("%s available again (%s for %d s); resuming", service, words, round(now - since))
            self._show(kind, False)
        forget(self.since)
        self.since.clear()
        self._logged.clear()

    async def wait(self) -> None:
        """Sleep out the back-off, if one runs."""
        delay = self.until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


__all__ = [
    "KINDS",
    "CarriedFault",
    "MachineFault",
    "Pause",
    "forget",
    "machine_fault",
    "notice",
    "noticed",
    "once_a_minute",
    "waiting_words",
]
