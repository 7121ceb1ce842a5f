"""A batch's results so far, a page at a time, for `GET /v1/batches/{id}/results` (our extension).

While the batch runs its results come in the order they were journaled: an unsealed shard's from the
store's result log (`ShardLedger.logged`), a sealed shard's from its results blob (`ShardLedger.sealed_seqs`
says which seqs each holds: the store keeps no sealed shard's results); once it is finished, from its output
and error files, in input order, walked beside the order blob the finalizer wrote with them
(`gateway.store.order_index`: each line's number, seq and kind). Each line is the output file's line with a
`"kind"` in front: `"output"` (a 2xx reply) or `"error"` (anything else: the error file's line).

The cursor counts by `seq` (the ledger numbers each journaled result 1, 2, …). `"{seq}"` (from the log):
every result with a larger seq is new. `"{seq}.{pos}"` (from the files): the order blob's entries from
`pos` on whose seq is larger, or 0 (a line answered at validation never enters the log, so no reader saw
it while the batch ran). A cursor taken while the batch ran carries over to its files: only the results
it had not seen come. Memory: one page (`limit` lines, and at most `max_bytes` of them past its first line)
and one line of each file, whatever the batch holds.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.domain import Result, Shard
from gateway.errors import Conflict, InvalidRequest
from gateway.json_codec import dumps, loads
from gateway.store.blobs.keys import file_key, order_key, shard_results_key
from gateway.store.order_index import read_entries
from gateway.store.protocols import Blobs, Store
from gateway.store.records import BatchRecord
from gateway.store.splitter import read_lines

_CURSOR = re.compile(r"(\d{1,18})(?:\.(\d{1,18}))?")
_Lines = AsyncIterator[bytes]
_OUTPUT, _ERROR = b'{"kind":"output",', b'{"kind":"error",'


@dataclass(frozen=True, slots=True)
class Cursor:
    seq: int = 0  # results up to this seq were read
    pos: int | None = None  # entries of the order blob read (None: the cursor came from the log)

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        if text is None or text == "":
            return cls()
        found = _CURSOR.fullmatch(text)
        if found is None:
            raise InvalidRequest(f"Invalid 'after': {text[:64]!r}. Pass the x-next-cursor of the previous page.",
                                 param="after", code="invalid_cursor")
        return cls(int(found[1]), int(found[2]) if found[2] is not None else None)

    def __str__(self) -> str:
        return str(self.seq) if self.pos is None else f"{self.seq}.{self.pos}"


@dataclass(slots=True)
class ResultsPage:
    lines: list[bytes]  # JSON lines, each with its "\n"
    cursor: Cursor  # where the next page starts
    has_more: bool  # more results are recorded already (a running batch may record more later)


async def results_page(store: Store, blobs: Blobs, batch: BatchRecord, after: Cursor, limit: int,
                       max_bytes: int | None = None) -> ResultsPage:
    """Up to `limit` lines from `after`, ending before the line that would take the page past `max_bytes`
    (its first line always comes, whatever its size: a page never stops a reader for good)."""
    room = max_bytes if max_bytes is not None else -1
    if not batch.status.finished:
        # The finalizer drops the log only after the batch reads finished: a reader that saw it running finds
        # the log, or (if it lost the race) an empty page and the same cursor, and the files next time.
        logged = await _running(store, blobs, batch.id, after.seq, limit + 1)
        if logged is None:  # a sealed shard's blob is merged and gone: the batch's files hold it next time
            return ResultsPage([], after, False)
        errors_inline = batch.options.run_batch_errors
        lines: list[bytes] = []
        size = 0
        for result in logged[:limit]:
            line = _marked(result.ok, dumps(result.output_line(errors_inline)))
            if lines and 0 <= room < size + len(line):
                break
            lines.append(line)
            size += len(line)
        seq = logged[len(lines) - 1].seq if lines else after.seq
        return ResultsPage(lines, Cursor(seq), len(logged) > len(lines))
    return await _from_files(store, blobs, batch, after, limit, room)


async def _running(store: Store, blobs: Blobs, batch_id: str, after: int, limit: int) -> list[Result] | None:
    """The results numbered `after` + 1 … `after` + `limit` (fewer if fewer are journaled yet), by seq: those of
    unsealed shards from the log, the sealed shards' from their results blobs. None: a sealed shard's blob is
    gone (the finalizer merged it into the batch's files).

    The log is read first: a shard sealed between the two reads is found by its span (its results read twice
    are kept once), so no seq is ever skipped. Memory: one page, and a line of the sealed shards' blobs at a
    time."""
    upto = after + limit
    found = {r.seq: r for r in await store.ledger.logged(batch_id, after, limit) if r.seq <= upto}
    for index, (first, last) in sorted((await store.ledger.sealed_seqs(batch_id)).items()):
        if last <= after or first > upto:
            continue
        key = shard_results_key(Shard(batch_id, index, "", 0))
        if await blobs.size(key) is None:
            return None
        async for raw in read_lines(blobs, key):
            if raw and after < (result := Result.from_json(loads(raw))).seq <= upto:
                found[result.seq] = result
    return [found[seq] for seq in sorted(found)]


def _marked(ok: bool, line: bytes) -> bytes:
    return (_OUTPUT if ok else _ERROR) + line[1:] + b"\n"


async def _from_files(store: Store, blobs: Blobs, batch: BatchRecord, after: Cursor, limit: int,
                      room: int) -> ResultsPage:
    start = after.pos or 0
    out = await _file_lines(store, batch, batch.output_file_id, blobs)
    err = await _file_lines(store, batch, batch.error_file_id, blobs)
    lines: list[bytes] = []
    index = size = 0
    async for seq, ok in _order(blobs, batch):
        fresh = index >= start and (seq == 0 or seq > after.seq)
        if fresh and len(lines) >= limit:
            return ResultsPage(lines, Cursor(after.seq, index), True)
        # Every entry moves its file on, read or not: the files hold the entries' lines in the same order.
        source = out if ok or not batch.options.split_errors else err
        line = await anext(source, None) if source is not None else None
        if line is None:
            raise _deleted(batch)
        if fresh:
            marked = _marked(ok, line)
            if lines and 0 <= room < size + len(marked):
                return ResultsPage(lines, Cursor(after.seq, index), True)
            lines.append(marked)
            size += len(marked)
        index += 1
    return ResultsPage(lines, Cursor(after.seq, max(index, start)), False)


async def _order(blobs: Blobs, batch: BatchRecord) -> AsyncIterator[tuple[int, bool]]:
    """(seq, ok) per result in input order; for a batch finished before the order blob existed (or one
    that never ran: cancelled or expired while validating, failed), its files' lines, output first."""
    key = order_key(batch.id)
    if await blobs.size(key) is not None:
        async for entry in read_entries(blobs, key):
            yield entry.seq, entry.ok
        return
    for file_id, ok in ((batch.output_file_id, True), (batch.error_file_id, False)):
        if file_id is not None:
            if await blobs.size(file_key(file_id)) is None:
                raise _deleted(batch)
            async for raw in read_lines(blobs, file_key(file_id)):
                if raw:
                    yield 0, ok and _replied_2xx(raw)  # without the order blob, read from the line


def _deleted(batch: BatchRecord) -> Conflict:
    return Conflict(f"The output files of batch {batch.id} were deleted: its results are gone.",
                    code="results_deleted")


async def _file_lines(store: Store, batch: BatchRecord, file_id: str | None, blobs: Blobs) -> _Lines | None:
    rec = await store.files.get(file_id, batch.files_owner) if file_id is not None else None
    return _nonblank(read_lines(blobs, rec.blob_key)) if rec is not None else None


async def _nonblank(lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for line in lines:
        if line:
            yield line


def _replied_2xx(raw: bytes) -> bool:
    data = loads(raw)
    response = data.get("response") if isinstance(data, dict) else None
    status = response.get("status_code") if isinstance(response, dict) else None
    return isinstance(status, int) and 200 <= status < 300


__all__ = ["Cursor", "ResultsPage", "results_page"]
