"""A batch whose shards are all sealed, as the shard runner leaves it for the finalizer, on the embedded store
and the `Blobs` given (a directory, or S3): for the merge's disk and recovery tests."""

from __future__ import annotations

from pathlib import Path

from gateway.domain import BatchStatus, Result, Shard
from gateway.json_codec import dumps, loads
from gateway.pipeline.merge import SEGMENT_BYTES, seal_shard
from gateway.pipeline.shard_input import LinesWriter, ShardRuns
from gateway.store.blobs.keys import shard_lines_key
from gateway.store.protocols import Blobs
from gateway.store.records import BatchRecord, RequestCounts
from gateway.store.splitter import read_lines
from gateway.store.sqlite.store import SQLiteStore

BATCH = "batch_d"
SHARDS, PER_SHARD = 6, 2
# Each shard's results a little over half a segment: a segment ends at every second shard.
BODY = "x" * (SEGMENT_BYTES // 3)


def one_route() -> list[tuple[str, list[int]]]:
    """6 shards of 2 lines on one route."""
    return [("m", list(range(i * PER_SHARD + 1, (i + 1) * PER_SHARD + 1))) for i in range(SHARDS)]


async def sealed_batch(tmp_path: Path, blobs: Blobs, layout: list[tuple[str, list[int]]] | None = None,
                       open_shards: frozenset[int] = frozenset()) -> tuple[SQLiteStore, list[Shard]]:
    """A running batch of shards laid out as `layout` (route, lines; default `one_route`), every line answered
    (200, a body of `BODY`) and each shard sealed and finished, but those of `open_shards`: their requests are
    written, nothing more (`answer` runs them)."""
    layout = layout or one_route()
    store = SQLiteStore(tmp_path / "s.sqlite3")
    await store.batches.put(BatchRecord(id=BATCH, owner="team", endpoint="/v1/chat/completions",
                                        input_file_id="file_x", completion_window="24h",
                                        status=BatchStatus.IN_PROGRESS, created_at=1, expires_at=10**10))
    shards = [Shard(BATCH, i, route, len(lines)) for i, (route, lines) in enumerate(layout)]
    await store.ledger.put_shards(BATCH, shards)
    total = sum(len(lines) for _, lines in layout)
    await store.batches.update(BATCH, {"counts": RequestCounts(total=total), "shards_total": len(shards)})
    await plan_lines(blobs, BATCH, [lines for _, lines in layout])
    for shard, (_, lines) in zip(shards, layout, strict=True):
        if shard.index not in open_shards:
            await answer(store, blobs, shard, lines)
            await store.ledger.finish_shard(shard)
    return store, shards


async def plan_lines(blobs: Blobs, batch_id: str, shard_lines: list[list[int]]) -> None:
    """What the planner writes for shards of these lines (`shard_input`): an input file of lines 1…n, each a
    request to model `m` with custom_id `c{line}`, and the batch's blob of where each shard's lines are."""
    total = max(line for lines in shard_lines for line in lines)
    raws = [dumps({"custom_id": f"c{line}", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m"}}) for line in range(1, total + 1)]
    starts = [0]
    for raw in raws:
        starts.append(starts[-1] + len(raw) + 1)
    input_key = f"files/input-{batch_id}"
    async with blobs.writing(input_key) as writer:
        await writer.write(b"".join(raw + b"\n" for raw in raws))
    async with blobs.writing(shard_lines_key(batch_id)) as writer:
        places = LinesWriter(writer, input_key)
        for index, lines in enumerate(shard_lines):
            runs = ShardRuns()
            for line in lines:
                runs.add(line, starts[line - 1], starts[line] - 1)
            await places.add(index, runs)
        await places.close(len(shard_lines))


async def answer(store: SQLiteStore, blobs: Blobs, shard: Shard, lines: list[int]) -> None:
    """Answer the shard's lines (200, a body of `BODY`) and seal it, as its runner does (not finished yet)."""
    await store.ledger.record_results(shard, [Result(line=line, custom_id=f"c{line}", status_code=200,
                                                     body={"n": line, "pad": BODY}, model="m") for line in lines])
    await seal_shard(store, blobs, shard, missing=None)


async def output_ids(store: SQLiteStore, blobs: Blobs) -> list[str]:
    """The completed batch's output file, as its lines' custom_ids (its record's size checked against it)."""
    batch = await store.batches.get(BATCH)
    assert batch is not None and batch.status is BatchStatus.COMPLETED and batch.output_file_id is not None
    record = await store.files.get(batch.output_file_id, batch.files_owner)
    assert record is not None and record.bytes == await blobs.size(record.blob_key)
    return [loads(raw)["custom_id"] async for raw in read_lines(blobs, record.blob_key) if raw]


async def read_all(blobs: Blobs, key: str) -> bytes:
    return b"".join([chunk async for chunk in blobs.read(key)])
