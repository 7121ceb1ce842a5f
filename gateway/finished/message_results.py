"""A Message Batch's results (`GET /v1/messages/batches/{id}/results`), as Anthropic's JSONL: one line per
request in input order, streamed (one chunk read held at a time), each merged output line mapped by
`gateway.message_batches.outcomes`; a batch that ended before any request ran answers each request with
what ended it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.domain import BatchStatus
from gateway.json_codec import dumps, loads
from gateway.message_batches.outcomes import message_result
from gateway.message_batches.wire import error_body
from gateway.store.protocols import Blobs, Store
from gateway.store.records import BatchRecord
from gateway.store.splitter import read_line_runs


async def message_batch_results(store: Store, blobs: Blobs, rec: BatchRecord) -> AsyncIterator[bytes]:
    """The results of an ended Message Batch, as chunks of JSON lines."""
    output = await store.files.get(rec.output_file_id, rec.files_owner) if rec.output_file_id else None
    return _result_lines(blobs, output.blob_key) if output is not None else await _unrun_lines(store, blobs, rec)


async def _result_lines(blobs: Blobs, key: str) -> AsyncIterator[bytes]:
    # A run of lines per chunk read, sent as one: a send per line cost more than the lines' own mapping.
    async for run in read_line_runs(blobs, key):
        if sent := b"".join(dumps(message_result(loads(raw))) + b"\n" for raw in run if raw):
            yield sent


async def _unrun_lines(store: Store, blobs: Blobs, rec: BatchRecord) -> AsyncIterator[bytes]:
    """A batch that ended before any request ran (cancelled, expired or failed while validating) has no
    output: each request's result is what ended it, read from its input file."""
    kind = {BatchStatus.CANCELLED: "canceled", BatchStatus.EXPIRED: "expired"}.get(rec.status)
    source = await store.files.get(rec.input_file_id, rec.files_owner)
    if source is None:
        return _empty()
    result: dict[str, Any] = {"type": kind} if kind else {"type": "errored", "error": error_body(
        "api_error", "; ".join(str(e.get("message")) for e in rec.errors) or "The batch failed.")}

    async def lines() -> AsyncIterator[bytes]:
        async for run in read_line_runs(blobs, source.blob_key):
            if sent := b"".join(dumps({"custom_id": loads(raw).get("custom_id"), "result": result}) + b"\n"
                                for raw in run if raw):
                yield sent

    return lines()


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""


__all__ = ["message_batch_results"]
