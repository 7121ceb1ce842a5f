"""A `--retry-failed` run's results merged back into the first run's files (`gateway.cli.rerun`).

The first run's output (and error) files are rewritten beside its results order index
(`gateway.store.order_index`): every line once, in input order, a retried line's new result in its place.
Rewritten in place, so the run's files are the merged ones from then on. Memory: one line of each file,
whatever the run holds.

A kill is survived at each step: the merged files are written to staging blobs first (the order index last,
so its presence says all three are whole), then copied into place, then a marker says the retry is merged; a
kill in between redoes only the copies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.store.blobs.composed import manifest_of
from gateway.store.blobs.keys import file_key, order_key, retry_merged_key, retry_staged_key
from gateway.store.order_index import IndexWriter, read_entries
from gateway.store.protocols import Blobs
from gateway.store.records import BatchRecord
from gateway.store.splitter import read_lines


async def is_merged(blobs: Blobs, retry_id: str) -> bool:
    """The retry batch's results are merged into its first run's files already."""
    return await blobs.size(retry_merged_key(retry_id)) is not None


async def merge_retry(blobs: Blobs, first: BatchRecord, retry: BatchRecord) -> tuple[int, int]:
    """Rewrite the first run's files with the retry's results in place; (now 2xx, still failing) lines."""
    split = first.options.split_errors
    # str(): the key as it was always spelled, even for a run that never wrote its output (no merge then reads it)
    places = {"output": file_key(str(first.output_file_id)), "order": order_key(first.id)}
    if split and first.error_file_id is not None:
        places["errors"] = file_key(first.error_file_id)
    ok = failed = 0
    if await blobs.size(retry_staged_key(first.id, "order")) is None:  # staged whole already: a kill came after
        ok, failed = await _stage(blobs, first, retry, "errors" in places)
    for part, key in places.items():  # the order blob last: a kill before it redoes every copy
        async with blobs.writing(key) as writer:
            async for chunk in blobs.read(retry_staged_key(first.id, part), 1 << 20):
                await writer.write(chunk)
        # The finalizer's merge left the file as segments read through a manifest: the copy stands in for them.
        await blobs.delete(manifest_of(key))
    async with blobs.writing(retry_merged_key(retry.id)) as writer:
        await writer.write(b"merged\n")
    for part in ("output", "errors", "order"):
        await blobs.delete(retry_staged_key(first.id, part))
    return ok, failed


async def _stage(blobs: Blobs, first: BatchRecord, retry: BatchRecord, split: bool) -> tuple[int, int]:
    old_out = _file(blobs, first.output_file_id)
    old_err = _file(blobs, first.error_file_id) if split else old_out
    new_out = _file(blobs, retry.output_file_id)
    new_err = _file(blobs, retry.error_file_id) if split else new_out
    new_order = read_entries(blobs, order_key(retry.id))
    ok = failed = 0
    # The order blob's block is the outermost: it appears last, once the files beside it are whole.
    order_at, out_at, err_at = (retry_staged_key(first.id, part) for part in ("order", "output", "errors"))
    index = IndexWriter()
    async with blobs.writing(order_at) as order, blobs.writing(out_at) as out, blobs.writing(err_at) as err:
        async for line, seq, was_ok in read_entries(blobs, order_key(first.id)):
            if was_ok:
                now_ok, data = True, await anext(old_out)
            else:
                await anext(old_err)  # the old failure: replaced by the retry's result
                entry = await anext(new_order)
                now_ok = entry.ok
                data = await anext(new_out if now_ok else new_err)
                ok += now_ok
                failed += not now_ok
            await (out if now_ok or not split else err).write(data + b"\n")
            await order.write(index.add(line, seq, now_ok))
        await order.write(index.end())
    return ok, failed


async def _file(blobs: Blobs, file_id: str | None) -> AsyncIterator[bytes]:
    if file_id is None:
        return
    async for raw in read_lines(blobs, file_key(file_id)):
        if raw:
            yield raw


__all__ = ["is_merged", "merge_retry"]
