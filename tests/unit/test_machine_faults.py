"""Which faults are the machine's (they pause and spend no attempt) and which are the work's (they keep both).

The exceptions are the ones the libraries raise: sqlite3's, an OSError's errno, redis-py's, botocore's
(as aiobotocore raises them for S3). A fault wrapped in another exception or a group is still found; a
group is the machine's only when each of its members is.
"""

from __future__ import annotations

import errno
import sqlite3

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from redis.exceptions import BusyLoadingError, ClusterDownError, ReadOnlyError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.faults import CarriedFault, Pause, machine_fault, waiting_words


def _s3(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


@pytest.mark.parametrize(("exc", "kind"), [
    (OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
    (OSError(errno.EIO, "Input/output error"), "disk_io_error"),
    (OSError(errno.EROFS, "Read-only file system"), "read_only"),
    (sqlite3.OperationalError("database or disk is full"), "disk_full"),
    (sqlite3.OperationalError("disk I/O error"), "disk_io_error"),
    (sqlite3.OperationalError("database is locked"), "database_locked"),
    (RedisConnectionError("Connection refused"), "redis_unreachable"),
    (RedisTimeoutError("Timeout reading from socket"), "redis_unreachable"),
    (BusyLoadingError("Redis is loading the dataset in memory"), "redis_unreachable"),
    (ResponseError("MISCONF Redis is configured to save RDB snapshots"), "redis_unreachable"),
    (ClusterDownError("CLUSTERDOWN The cluster is down"), "redis_unreachable"),  # a cluster failing over
    (TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"), "redis_unreachable"),
    (ReadOnlyError("READONLY You can't write against a read only replica."), "redis_unreachable"),
    (_s3("SlowDown", 503), "s3_unavailable"),
    (_s3("InternalError", 500), "s3_unavailable"),
    (_s3("RequestTimeout", 400), "s3_unavailable"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "s3_unreachable"),
    (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), "s3_unreachable"),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), "s3_unreachable"),
    (CarriedFault("disk_full", "[Errno 28] No space left on device"), "disk_full"),
])
def test_faults_of_the_machine(exc: BaseException, kind: str) -> None:
    fault = machine_fault(exc)
    assert fault is not None and fault.kind == kind


@pytest.mark.parametrize("exc", [
    ValueError("a bad line"),
    KeyError("model"),
    OSError(errno.ENOENT, "No such file or directory"),  # a missing file is a bug or a race, not the disk
    sqlite3.IntegrityError("UNIQUE constraint failed"),
    ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    _s3("NoSuchKey", 404),
    _s3("AccessDenied", 403),
])
def test_faults_of_the_work(exc: BaseException) -> None:
    assert machine_fault(exc) is None


def test_a_fault_is_found_through_causes_and_groups() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("could not seal the shard") from inner
    except RuntimeError as outer:
        wrapped = outer
    assert (fault := machine_fault(wrapped)) is not None and fault.kind == "disk_full"
    full = OSError(errno.ENOSPC, "No space left on device")
    assert machine_fault(ExceptionGroup("shard", [full, _s3("SlowDown", 503)])) is not None
    assert machine_fault(ExceptionGroup("shard", [full, ValueError("a bug")])) is None  # the work's: one attempt


def test_the_back_off_doubles_per_try_to_its_ceiling_and_resets_on_a_later_success() -> None:
    pause = Pause(first=1.0, ceiling=30.0)
    fault = machine_fault(OSError(errno.ENOSPC, "No space left on device"))
    assert fault is not None
    # the shards in flight when the fault came each meet it: one step, not one per shard
    assert [pause.fault(fault) for _ in range(5)] == [1, 1, 1, 1, 1]
    delays = []
    for _ in range(6):
        pause.until = 0.0  # the wait is over: the next try that meets the fault is the next step
        delays.append(pause.fault(fault))
    assert delays == [2, 4, 8, 16, 30, 30]
    assert pause.paused and list(pause.since) == ["disk_full"]
    pause.succeeded(started=pause.last_fault - 1)  # a shard taken before the last fault proves nothing
    assert pause.paused
    pause.succeeded(started=pause.last_fault + 1)
    assert not pause.paused and pause.fault(fault) == 1


def test_the_dashboard_word() -> None:
    assert waiting_words({}) is None
    assert waiting_words({"disk_full": 0.0}) == "waiting: disk full since 00:00 UTC"
    assert waiting_words({"s3_unavailable": 3600.0, "redis_unreachable": 60.0}) == \
        "waiting: Redis unreachable since 00:01 UTC, S3 throttled or 5xx since 01:00 UTC"


async def test_a_command_written_to_a_connection_closed_under_it_is_redis_unreachable() -> None:
    # redis-py's connection whose transport a failover tore down meanwhile (here: never opened) raises an
    # AttributeError from inside redis-py, not a ConnectionError (redis-py #4287): still Redis's fault
    from redis.asyncio.connection import Connection

    with pytest.raises(AttributeError) as caught:
        await Connection()._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
    assert (fault := machine_fault(caught.value)) is not None and fault.kind == "redis_unreachable"
    with pytest.raises(AttributeError) as ours:
        None.writelines([])  # type: ignore[attr-defined]  # the same error outside redis-py: a bug of ours
    assert machine_fault(ours.value) is None
