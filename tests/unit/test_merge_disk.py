"""A batch's disk stays flat: beside its input and output, about one segment of shards, whatever its size.

- Sealing a shard deletes its requests blob, and its results leave the store's result log (the results blob
  holds them); the merge deletes each shard's results blob once they are in a written segment of the output.
- After a batch completes its working blobs (shards' requests and results, the merge's checkpoint) are
  gone, and the store keeps no row per line of it: journal, result log and sealed spans are empty.
- Routes whose lines interleave merge in input order, one shard of each route read at a time.
- A finalizer that dies mid-merge (here: a shard's results blob that cannot be read past a point, a real fault
  of the file) has deleted the shards it merged; run again, it goes on from its checkpoint and the output
  holds every line once, in input order, with the batch's counts whole.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gateway.domain import BatchRequest, BatchStatus, Endpoint, Result, Shard
from gateway.json_codec import dumps, loads
from gateway.pipeline.finalizer import Finalizer
from gateway.pipeline.merge import SEGMENT_BYTES, seal_shard
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import file_key, merge_checkpoint_key, shard_requests_key, shard_results_key
from gateway.store.records import BatchRecord, RequestCounts
from gateway.store.splitter import read_lines
from gateway.store.sqlite.coordination import SQLiteCoordination
from gateway.store.sqlite.store import SQLiteStore

BATCH = "batch_d"
SHARDS, PER_SHARD = 6, 2
# Each shard's results a little over half a segment: a segment ends at every second shard.
BODY = "x" * (SEGMENT_BYTES // 3)


def _one_route() -> list[tuple[str, list[int]]]:
    return [("m", list(range(i * PER_SHARD + 1, (i + 1) * PER_SHARD + 1))) for i in range(SHARDS)]


async def _batch(tmp_path: Path, layout: list[tuple[str, list[int]]] | None = None,
                 ) -> tuple[SQLiteStore, LocalBlobs, SQLiteCoordination, list[Shard]]:
    """A batch of shards laid out as `layout` (route, lines) (default: 6 shards of 2 lines on one route), every
    line answered and each shard sealed, as the runner leaves it."""
    layout = layout or _one_route()
    store, blobs = SQLiteStore(tmp_path / "s.sqlite3"), LocalBlobs(tmp_path / "blobs")
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    await store.batches.put(BatchRecord(id=BATCH, owner="team", endpoint="/v1/chat/completions",
                                        input_file_id="file_x", completion_window="24h",
                                        status=BatchStatus.IN_PROGRESS, created_at=1, expires_at=10**10))
    shards = [Shard(BATCH, i, route, len(lines)) for i, (route, lines) in enumerate(layout)]
    await store.ledger.put_shards(BATCH, shards)
    total = sum(len(lines) for _, lines in layout)
    await store.batches.update(BATCH, {"counts": RequestCounts(total=total), "shards_total": len(shards)})
    for shard, (_, lines) in zip(shards, layout, strict=True):
        async with blobs.writing(shard_requests_key(shard)) as writer:
            for line in lines:
                await writer.write(dumps(BatchRequest(line, f"c{line}", Endpoint.CHAT, {"model": "m"}).to_json())
                                   + b"\n")
        await store.ledger.record_results(shard, [Result(line=line, custom_id=f"c{line}", status_code=200,
                                                         body={"n": line, "pad": BODY}, model="m") for line in lines])
        await seal_shard(store, blobs, shard, missing=None)
        await store.ledger.finish_shard(shard)
    return store, blobs, coordination, shards


def _rows_left(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE batch_id = ?", (BATCH,)).fetchone()[0]
                for table in ("journal", "results_log", "sealed_seqs")}


async def _output(store: SQLiteStore, blobs: LocalBlobs) -> list[str]:
    batch = await store.batches.get(BATCH)
    assert batch is not None and batch.status is BatchStatus.COMPLETED and batch.output_file_id is not None
    record = await store.files.get(batch.output_file_id, batch.files_owner)
    assert record is not None and record.bytes == await blobs.size(record.blob_key)
    return [loads(raw)["custom_id"] async for raw in read_lines(blobs, record.blob_key) if raw]


async def test_a_completed_batch_leaves_no_working_blobs_and_no_rows_per_line(tmp_path: Path) -> None:
    store, blobs, coordination, shards = await _batch(tmp_path)
    try:
        # Sealed: no shard's requests are kept, and the store's result log holds none of their results.
        assert [await blobs.size(shard_requests_key(s)) for s in shards] == [None] * SHARDS
        assert _rows_left(tmp_path / "s.sqlite3") == {"journal": 0, "results_log": 0, "sealed_seqs": SHARDS}
        await Finalizer(store, blobs, coordination, lambda route: None).finalize(BATCH)
        assert await _output(store, blobs) == [f"c{line}" for line in range(1, SHARDS * PER_SHARD + 1)]
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
        assert _rows_left(tmp_path / "s.sqlite3") == {"journal": 0, "results_log": 0, "sealed_seqs": 0}
        # What the files hold is the output and its order index, once: no shard's results beside them.
        batch = await store.batches.get(BATCH)
        assert batch is not None and batch.output_file_id is not None
        output = await blobs.size(file_key(batch.output_file_id)) or 0
        on_disk = sum(p.stat().st_size for p in (tmp_path / "blobs").rglob("*") if p.is_file())
        assert output < on_disk < output * 1.01
    finally:
        await store.aclose()
        await coordination.aclose()


async def test_a_finalizer_that_dies_mid_merge_goes_on_and_writes_the_whole_output_once(tmp_path: Path) -> None:
    store, blobs, coordination, shards = await _batch(tmp_path)
    finalizer = Finalizer(store, blobs, coordination, lambda route: None)
    try:
        # The last shard's second result cannot be read: the merge dies there, past two segments (shards 0-3).
        broken = tmp_path / "blobs" / shard_results_key(shards[5])
        whole = broken.read_bytes()
        first, _, rest = whole.partition(b"\n")
        broken.write_bytes(first + b"\n{\n" + rest)
        with pytest.raises(json.JSONDecodeError):
            await finalizer.finalize(BATCH)
        assert [await blobs.size(shard_results_key(s)) is None for s in shards] == [True] * 4 + [False] * 2
        state = json.loads(await _read(blobs, merge_checkpoint_key(BATCH)))
        assert (state["segments"], state["merged"]) == (2, [0, 1, 2, 3])

        broken.write_bytes(whole)  # the file readable again: the finalizer run again goes on from its checkpoint
        await finalizer.finalize(BATCH)
        assert await _output(store, blobs) == [f"c{line}" for line in range(1, SHARDS * PER_SHARD + 1)]
        batch = await store.batches.get(BATCH)
        assert batch is not None and (batch.counts.completed, batch.counts.failed) == (SHARDS * PER_SHARD, 0)
        assert batch.summary is not None and batch.summary["succeeded"] == SHARDS * PER_SHARD
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
    finally:
        await store.aclose()
        await coordination.aclose()


async def test_routes_whose_lines_interleave_merge_in_input_order(tmp_path: Path) -> None:
    # Odd lines on route a, even on b, two shards each: the merge reads one shard of each route at a time.
    layout = [("a", [1, 3]), ("b", [2, 4]), ("a", [5, 7]), ("b", [6, 8]), ("a", [9, 11]), ("b", [10, 12])]
    store, blobs, coordination, _ = await _batch(tmp_path, layout)
    try:
        await Finalizer(store, blobs, coordination, lambda route: None).finalize(BATCH)
        assert await _output(store, blobs) == [f"c{line}" for line in range(1, 13)]
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
    finally:
        await store.aclose()
        await coordination.aclose()


async def _read(blobs: LocalBlobs, key: str) -> bytes:
    return b"".join([chunk async for chunk in blobs.read(key)])
