"""A Message Batch's files and records, for Anthropic's door (`gateway.api.message_batches` asks; it writes
nothing itself): the create, streamed from the request body to the batch, and the delete.

The create holds the same line as every door: the team's budget, active batches and storage are checked
before a byte is read (`BatchService.check_room`); the body is counted as it streams, into a temporary file
on disk (never held in memory), up to the door's limit; then, in a thread (off the API's loop), it is read
request by request (`gateway.message_batches.envelope`: bounded values and depth per request) into the
pipeline's input lines, themselves on disk; those are uploaded as the batch's input file (counted against
the team's own storage) and the batch is created through the same intake as an OpenAI batch. The API's
memory for one create is a window of the body and one request at a time, whatever the body's shape.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from typing import IO

from gateway.domain import MESSAGE_BATCH_KIND, Endpoint
from gateway.errors import TooLarge
from gateway.message_batches.envelope import read_create
from gateway.message_batches.wire import COMPLETION_WINDOW
from gateway.pipeline.batch_service import BatchService
from gateway.store.objects import BatchOptions, BatchRecord, RequestCounts, message_batch_files_owner

_READ = 1 << 20  # bytes of the input lines read from disk per chunk uploaded


def too_large(limit: int) -> TooLarge:
    """Anthropic's 413 `request_too_large` (its door maps `TooLarge` to it)."""
    return TooLarge(f"Request exceeds the maximum allowed number of bytes ({limit}).", code="request_too_large")


async def create_message_batch(
    service: BatchService, owner: str, body: AsyncIterable[bytes], *, declared: int | None, limit: int,
    allowed_models: list[str] | None,
) -> BatchRecord:
    """The Message Batch of the create body streamed in `body` (`declared`: its Content-Length, if sent), or
    the refusal: `TooLarge` past `limit` bytes, `OverQuota` (budget, active batches, storage), an
    `EnvelopeError` for a body Anthropic refuses whole."""
    if declared is not None and declared > limit:
        raise too_large(limit)
    await service.check_room(owner, declared or 0)
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as lines:
        size = 0
        async for chunk in body:
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            spool.write(chunk)  # into the page cache: microseconds a chunk
        spool.seek(0)
        count = await asyncio.to_thread(read_create, spool, lines)
        spool.truncate(0)
        lines.seek(0)
        hidden = message_batch_files_owner(owner)  # kept out of the team's files list, counted as the team's
        source = await service.upload_file(hidden, "message_batch_requests.jsonl", "batch", _read(lines))
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


__all__ = ["create_message_batch", "delete_message_batch", "too_large"]
