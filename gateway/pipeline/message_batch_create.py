"""A Message Batch's files and records, for Anthropic's door (`gateway.api.message_batches` asks; it writes
nothing itself): the create, streamed from the request body to the batch, and the delete.

The create holds the same line as every door: the team's budget, active batches and storage are checked
before a byte is read (`BatchService.check_room`); the body is counted as it streams, into a temporary file
on disk (never held in memory), up to the door's limit; then it is read request by request
(`gateway.message_batches.envelope`: bounded values and depth per request) into the pipeline's input lines,
themselves on disk. That reading is pure-Python CPU work: it runs in one of the validation processes (the
runtime's `ValidationProcesses.read_create`, given the two files' paths), so the API's loop keeps the GIL
and its core for every other team (in a thread of the API process it held the GIL: another team's p99
past 100 ms during a 200 MB create). Without those processes (`validation_processes=0`) it runs in a thread. A process
that dies mid-read is replaced and the read tried once more (the body is still on disk); a second death is
`BrokenProcessPool`, which the door answers as a retryable overload. The lines are then uploaded as the
batch's input file (counted against the team's own storage) and the batch is created through the same
intake as an OpenAI batch. The API's memory for one create is a chunk of the body at a time, whatever its
shape; the reading process's is a window of the body and one request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import IO

from gateway.domain import MESSAGE_BATCH_KIND, Endpoint
from gateway.errors import TooLarge
from gateway.message_batches.envelope import read_create
from gateway.message_batches.wire import COMPLETION_WINDOW
from gateway.pipeline.batch_service import BatchService
from gateway.store.records import BatchOptions, BatchRecord, RequestCounts, message_batch_files_owner

log = logging.getLogger(__name__)

_READ = 1 << 20  # bytes of the input lines read from disk per chunk uploaded
# Bytes of the body gathered before they go to the spool, in a thread: a write may wait for the disk (the
# kernel throttles a writer past its share of dirty pages: stalls of 10-30 ms on the API's loop).
_SPOOL = 1 << 20
_TRIES = 2  # a reading process that died (killed, out of memory) is replaced once

# Reads the spooled body at the first path into the input lines at the second; returns how many requests
# (the runtime's `ValidationProcesses.read_create`).
BodyReader = Callable[[Path, Path], Awaitable[int]]


_SPOOL_PREFIX = "batchyard-message-batch-"  # then the API process's pid: `remove_stale_spools` reads it


def remove_stale_spools(where: Path | None = None) -> int:
    """Deletes the spool directories of API processes that are gone (a SIGKILL mid-create leaves up to twice
    the body in the temp directory); how many. Called as the API starts. A pid reused since by another
    process keeps its directory until a later start: nothing is removed that a live process may hold."""
    removed = 0
    for path in (where or Path(tempfile.gettempdir())).glob(f"{_SPOOL_PREFIX}*-*"):
        pid = path.name[len(_SPOOL_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d Message Batch spool(s) left by API processes that are gone", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def too_large(limit: int) -> TooLarge:
    """Anthropic's 413 `request_too_large` (its door maps `TooLarge` to it)."""
    return TooLarge(f"Request exceeds the maximum allowed number of bytes ({limit}).", code="request_too_large")


async def create_message_batch(
    service: BatchService, owner: str, body: AsyncIterable[bytes], *, declared: int | None, limit: int,
    allowed_models: list[str] | None, reader: BodyReader | None = None,
) -> BatchRecord:
    """The Message Batch of the create body streamed in `body` (`declared`: its Content-Length, if sent), or
    the refusal: `TooLarge` past `limit` bytes, `OverQuota` (budget, active batches, storage), an
    `EnvelopeError` for a body Anthropic refuses whole. `reader`: where the body is read (None: a thread);
    `BrokenProcessPool` when the reading process died twice."""
    if declared is not None and declared > limit:
        raise too_large(limit)
    await service.check_room(owner, declared or 0)
    # Named files (in a directory only this process's user reads): a reading process opens them by path.
    where = Path(tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-"))
    try:
        spool_path, lines_path = where / "body.json", where / "requests.jsonl"
        with spool_path.open("wb") as spool:
            size = 0
            pending = bytearray()
            async for chunk in body:
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                pending += chunk
                if len(pending) >= _SPOOL:
                    await asyncio.to_thread(spool.write, pending)
                    pending.clear()
            await asyncio.to_thread(spool.write, pending)
        count = await _read_body(spool_path, lines_path, reader)
        await asyncio.to_thread(spool_path.unlink)  # its disk back before the lines are copied
        hidden = message_batch_files_owner(owner)  # kept out of the team's files list, counted as the team's
        with lines_path.open("rb") as lines:
            source = await service.upload_file(hidden, "message_batch_requests.jsonl", "batch", _read(lines))
    finally:
        # In a thread: unlinking a file of 200 MB frees its blocks there and then (the API's loop stalled
        # 40-70 ms on it). Run to its end even if this task is cancelled meanwhile.
        await asyncio.to_thread(shutil.rmtree, where, True)
    try:
        rec = await service.create_batch(
            owner, input_file_id=source.id, endpoint=Endpoint.MESSAGES.value, completion_window=COMPLETION_WINDOW,
            allowed_models=allowed_models, options=BatchOptions(strict=False, split_errors=False),
            kind=MESSAGE_BATCH_KIND, input_owner=hidden,
        )
    except BaseException:
        await service.delete_file(source.id, hidden)
        raise
    # Known now: `request_counts.processing` from the first GET, before validation has counted the lines.
    await service.store.batches.update(rec.id, {"counts": RequestCounts(total=count)})
    rec.counts.total = count
    return rec


async def _read_body(source: Path, sink: Path, reader: BodyReader | None) -> int:
    """The body at `source` read into the input lines at `sink`; how many requests."""
    if reader is None:
        with source.open("rb") as body, sink.open("wb") as lines:
            return await asyncio.to_thread(read_create, body, lines)
    for _ in range(_TRIES - 1):
        try:
            return await reader(source, sink)
        except BrokenProcessPool:  # the pool starts fresh processes; the sink is written again from its start
            log.warning("a validation process died while reading a Message Batch create; reading it again")
    return await reader(source, sink)


async def _read(file: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(file.read, _READ):
        yield chunk


async def delete_message_batch(service: BatchService, rec: BatchRecord) -> bool:
    """An ended Message Batch's record, then its files: its input and its output (the results; the order
    index beside them goes with them, `BatchService.delete_file`). False: it was gone already."""
    if not await service.store.batches.delete(rec.id, rec.owner):
        return False
    await service.delete_file(rec.input_file_id, rec.files_owner)
    for file_id in (rec.output_file_id, rec.error_file_id):
        if file_id:
            await service.delete_file(file_id, rec.files_owner)
    return True


__all__ = ["BodyReader", "create_message_batch", "delete_message_batch", "remove_stale_spools", "too_large"]
