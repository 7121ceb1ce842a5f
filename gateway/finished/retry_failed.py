"""`POST /v1/batches/{id}/retry` (our extension): a finished batch's lines without a 2xx reply, again.

The new batch's input file holds exactly the original input lines whose result was not a 2xx reply
(failed, expired, or cancelled before they ran), byte for byte with their custom_ids, in input order. It
is uploaded and created through the intake (`BatchService.upload_file`, `create_batch`), so the team's
storage, quotas and budget and the validation apply as to any batch. Which lines: the order blob the
finalizer wrote beside the output files (`gateway.store.order_index`), walked beside the input file; memory: one
line, whatever the file holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.domain import BatchStatus
from gateway.errors import Conflict, not_found
from gateway.pipeline.batch_service import BatchService
from gateway.store.blobs.keys import order_key
from gateway.store.order_index import OrderEntry, read_entries
from gateway.store.protocols import Blobs
from gateway.store.records import BatchOptions, BatchRecord
from gateway.store.splitter import split_lines

_CHUNK = 1 << 16
_MAX_METADATA = 16  # OpenAI's limit on metadata keys (`checked_metadata`)


async def retry_batch(service: BatchService, batch_id: str, owner: str,
                      allowed_models: list[str] | None) -> BatchRecord:
    """The new batch (`validating`), or a domain error: 404 another team's or no batch, 409 one still
    running, one that failed validation, one whose input file is gone, or one with nothing to retry."""
    batch = await service.store.batches.get(batch_id, owner)
    if batch is None:
        raise not_found("batch", batch_id)
    if not batch.status.finished:
        raise Conflict(f"Cannot retry a batch with status '{batch.status.value}': wait until it is completed, "
                       "expired or cancelled (or cancel it).", code="batch_not_finished")
    if batch.status is BatchStatus.FAILED:
        raise Conflict("Cannot retry a batch that failed validation: none of its lines ran. Fix the input file "
                       "and create a new batch.", code="batch_failed")
    source = await service.store.files.get(batch.input_file_id, owner)
    if source is None:
        raise Conflict(f"The input file {batch.input_file_id} of batch {batch_id} was deleted: there are no lines "
                       "to retry.", code="input_file_deleted")
    every_line = await _never_ran(service.blobs, batch)
    if not every_line and await _count_failed(service.blobs, batch_id) == 0:
        raise Conflict(f"Batch {batch_id} has nothing to retry: every line got a 2xx reply.", code="nothing_to_retry")
    lines = _all_lines(service.blobs, source.blob_key) if every_line \
        else _failed_lines(service.blobs, source.blob_key, order_key(batch_id))
    upload = await service.upload_file(owner, f"{batch_id}_retry.jsonl", "batch", _chunks(lines))
    meta = {k: v for k, v in (batch.metadata or {}).items() if k != "retry_of"}
    metadata = {**dict(list(meta.items())[:_MAX_METADATA - 1]), "retry_of": batch_id}
    try:
        return await service.create_batch(
            owner, input_file_id=upload.id,
            endpoint=None if batch.endpoint == "*" else batch.endpoint,  # the CLI's: any url
            completion_window=None if batch.completion_window == "none" else batch.completion_window,
            metadata=metadata, output_expires_after=batch.output_expires_after, allowed_models=allowed_models,
            options=BatchOptions(strict=batch.options.strict, split_errors=batch.options.split_errors,
                                 run_batch_errors=batch.options.run_batch_errors,
                                 output_reruns=batch.options.output_reruns),
        )
    except BaseException:
        await service.delete_file(upload.id, owner)  # refused (a quota, the window): no orphan file is left
        raise


async def _never_ran(blobs: Blobs, batch: BatchRecord) -> bool:
    """Cancelled or expired while validating: no shard, no result, every line is to run."""
    return batch.shards_total == 0 and await blobs.size(order_key(batch.id)) is None


async def _count_failed(blobs: Blobs, batch_id: str) -> int:
    if await blobs.size(order_key(batch_id)) is None:
        # Its output files were deleted (the order blob goes with them), or it was finalized before the order
        # blob existed: which lines failed is not known line by line.
        raise Conflict(f"Which lines of batch {batch_id} failed is no longer known (its output files were "
                       "deleted, or an older version of the gateway finished it): retry is not available for it.",
                       code="retry_unavailable")
    count = 0
    async for entry in read_entries(blobs, order_key(batch_id)):
        count += not entry.ok
    return count


async def _all_lines(blobs: Blobs, key: str) -> AsyncIterator[bytes]:
    async for raw in split_lines(blobs.read(key)):
        if isinstance(raw, bytes) and raw.strip():
            yield raw


async def _failed_lines(blobs: Blobs, input_key: str, order: str) -> AsyncIterator[bytes]:
    """The input lines whose order entry is `e`. Both are in input order; lines are numbered as the planner
    numbers them (1, 2, … over every line, blank ones included)."""
    entries = read_entries(blobs, order)
    entry: OrderEntry | None = None
    number = 0
    async for raw in split_lines(blobs.read(input_key)):
        number += 1
        while entry is None or entry.line < number:
            entry = await anext(entries, None)
            if entry is None:
                return
        if entry.line == number and not entry.ok and isinstance(raw, bytes):
            yield raw


async def _chunks(lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    buffer = bytearray()
    async for line in lines:
        buffer += line
        buffer += b"\n"
        if len(buffer) >= _CHUNK:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


__all__ = ["retry_batch"]
