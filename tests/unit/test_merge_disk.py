"""A batch's disk stays flat: beside its input and output, about one segment of shards, whatever its size.

- Sealing a shard deletes its requests blob, and its results leave the store's result log (the results blob
  holds them); the merge deletes each shard's results blob once they are in a written segment of the output.
- After a batch completes its working blobs (shards' requests and results, the merge's checkpoint) are gone,
  the files hold the output and its order index once, and the store keeps no row per line of it: journal,
  result log and sealed spans are empty.
- Routes whose lines interleave merge in input order, one shard of each route read at a time.
- While the batch runs, each finished shard merges what is sealed before the first shard still open, up to
  that shard's first line: a big batch's sealed results do not wait beside the output for its last shard.
A finalizer that dies mid-merge, on a directory and on S3: `tests/servers/test_merge_recovery.py`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.domain import Result
from gateway.json_codec import loads
from gateway.pipeline.checkpoint import load
from gateway.pipeline.finalizer import Finalizer
from gateway.pipeline.merge import seal_shard
from gateway.pipeline.shard_input import read_requests
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import (
    file_key,
    merge_checkpoint_key,
    shard_lines_key,
    shard_requests_key,
    shard_results_key,
)
from gateway.store.sqlite.coordination import SQLiteCoordination
from gateway.store.sqlite.store import SQLiteStore
from tests.support.sealed_batch import BATCH, SHARDS, answer, output_ids, sealed_batch


def _rows_left(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE batch_id = ?", (BATCH,)).fetchone()[0]
                for table in ("journal", "results_seq", "sealed_seqs")}


async def test_a_completed_batch_leaves_no_working_blobs_and_no_rows_per_line(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    store, shards = await sealed_batch(tmp_path, blobs)
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    try:
        # Sealed: no copy of a shard's lines (one small blob says where they are in the input, 6 shards in under
        # 1 KB), and the store's result log holds none of their results.
        assert [await blobs.size(shard_requests_key(s)) for s in shards] == [None] * SHARDS
        assert 0 < (await blobs.size(shard_lines_key(BATCH)) or 0) < 1024
        assert _rows_left(tmp_path / "s.sqlite3") == {"journal": 0, "results_seq": 0, "sealed_seqs": SHARDS}
        await Finalizer(store, blobs, coordination, lambda route: None).finalize(BATCH)
        assert await output_ids(store, blobs) == [f"c{line}" for line in range(1, 13)]
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
        assert _rows_left(tmp_path / "s.sqlite3") == {"journal": 0, "results_seq": 0, "sealed_seqs": 0}
        # What the files hold is the output and its order index, once: no shard's results beside them.
        batch = await store.batches.get(BATCH)
        assert batch is not None and batch.output_file_id is not None
        output = await blobs.size(file_key(batch.output_file_id)) or 0
        on_disk = sum(p.stat().st_size for p in (tmp_path / "blobs").rglob("*") if p.is_file())
        assert output < on_disk < output * 1.01
    finally:
        await store.aclose()
        await coordination.aclose()


async def test_routes_whose_lines_interleave_merge_in_input_order(tmp_path: Path) -> None:
    # Odd lines on route a, even on b, three shards each: the merge reads one shard of each route at a time.
    layout = [("a", [1, 3]), ("b", [2, 4]), ("a", [5, 7]), ("b", [6, 8]), ("a", [9, 11]), ("b", [10, 12])]
    blobs = LocalBlobs(tmp_path / "blobs")
    store, _ = await sealed_batch(tmp_path, blobs, layout)
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    try:
        await Finalizer(store, blobs, coordination, lambda route: None).finalize(BATCH)
        assert await output_ids(store, blobs) == [f"c{line}" for line in range(1, 13)]
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
    finally:
        await store.aclose()
        await coordination.aclose()


async def test_a_running_batch_merges_its_sealed_shards_up_to_the_first_one_still_open(tmp_path: Path) -> None:
    # Two routes, their lines interleaved; shard 2 (lines 5 and 7) still runs, shard 3 (6 and 10) is sealed.
    layout = [("a", [1, 3]), ("b", [2, 4]), ("a", [5, 7]), ("b", [6, 10]), ("a", [8, 9]), ("b", [11, 12])]
    blobs = LocalBlobs(tmp_path / "blobs")
    store, shards = await sealed_batch(tmp_path, blobs, layout, open_shards=frozenset({2, 4, 5}))
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    finalizer = Finalizer(store, blobs, coordination, lambda route: None)
    try:
        # Shard 1 finishing merges lines 1-4 (shards 0 and 1, over a segment's bytes): line 5 is shard 2's.
        await finalizer.finish_shard(shards[1])
        state = await load(blobs, merge_checkpoint_key(BATCH))
        assert state.merged == {0, 1} and state.read == {}
        assert state.summary["n_out"] == 4
        assert [await blobs.size(shard_results_key(s)) is None for s in shards[:4]] == [True, True, True, False]
        # A merged shard's lines read as gone (the checkpoint says so), though the blob naming them stays: a
        # worker taken for dead that runs it again, or gives it up, neither runs nor seals it again.
        assert await read_requests(blobs, shards[0]) is None
        assert [r.line for r in await read_requests(blobs, shards[2]) or []] == [5, 7]
        await seal_shard(store, blobs, shards[0], missing=("batch_failed", "given up"))
        assert await blobs.size(shard_results_key(shards[0])) is None
        # Shard 3 finishing merges nothing: shard 2 still holds line 5, before any of shard 3's.
        await finalizer.finish_shard(shards[3])
        assert (await load(blobs, merge_checkpoint_key(BATCH))).segments == state.segments
        # Shard 2 ends: lines 5-7 merge (shard 4 holds line 8), shard 3 half merged; then the rest with the last
        # shard, which finalizes the batch.
        await answer(store, blobs, shards[2], [5, 7])
        await finalizer.finish_shard(shards[2])
        state = await load(blobs, merge_checkpoint_key(BATCH))
        assert state.merged == {0, 1, 2} and state.read == {3: 1} and state.summary["n_out"] == 7
        for index, lines in ((4, [8, 9]), (5, [11, 12])):
            await answer(store, blobs, shards[index], lines)
            await finalizer.finish_shard(shards[index])
        assert await output_ids(store, blobs) == [f"c{line}" for line in range(1, 13)]
        assert not (tmp_path / "blobs" / "batches" / BATCH).exists()
        batch = await store.batches.get(BATCH)
        assert batch is not None and batch.summary["succeeded"] == 12
    finally:
        await store.aclose()
        await coordination.aclose()


async def test_the_running_log_keeps_each_result_once_and_an_older_data_dir_is_migrated(tmp_path: Path) -> None:
    # An older release's log held a second copy of each journaled result: its rows become seqs of the journal's.
    blobs = LocalBlobs(tmp_path / "blobs")
    store, shards = await sealed_batch(tmp_path, blobs, open_shards=frozenset({0}))
    await store.ledger.record_results(shards[0], [Result(line=1, custom_id="c1", status_code=200, body={}, model="m")])
    await store.aclose()
    with sqlite3.connect(tmp_path / "s.sqlite3") as conn:
        (data,) = conn.execute("SELECT data FROM journal WHERE batch_id = ?", (BATCH,)).fetchone()
        conn.execute("DROP TABLE results_seq")
        conn.execute("CREATE TABLE results_log (batch_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, "
                     "PRIMARY KEY (batch_id, seq))")
        conn.execute("INSERT INTO results_log VALUES (?, ?, ?)", (BATCH, loads(data)["seq"], data))
    store = SQLiteStore(tmp_path / "s.sqlite3")
    try:
        assert [(r.line, r.custom_id) for r in await store.ledger.logged(BATCH, 0, 10)] == [(1, "c1")]
        with sqlite3.connect(tmp_path / "s.sqlite3") as conn:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "results_log" not in tables and "results_seq" in tables
        # The next result takes the next seq; once the shard is sealed the log holds neither.
        await store.ledger.record_results(shards[0], [Result(line=2, custom_id="c2", status_code=200, body={},
                                                             model="m")])
        assert [r.seq for r in await store.ledger.logged(BATCH, 0, 10)] == [loads(data)["seq"],
                                                                            loads(data)["seq"] + 1]
        await store.ledger.drop_journal(shards[0])
        assert await store.ledger.logged(BATCH, 0, 10) == []
    finally:
        await store.aclose()
