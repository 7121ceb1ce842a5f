"""A batch's results so far, a page at a time (`gateway.finished.results`), on the embedded store in process.

- While the batch runs, pages come from the result log in the order results were journaled; the cursor
  fetches only what is new.
- The finalizer writes the order blob (line, seq, kind) beside the output files; a cursor taken while the
  batch ran then brings only the lines it had not seen (here: the ones cancelled before they ran), in
  input order; from scratch, every line in input order, each marked `output` or `error`.
- A sealed shard's results leave the store (and its requests blob goes): pages read them from the shard's
  results blob by their seq, the same pages as before its seal.
- A cursor that is not ours is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.domain import BatchStatus, Result, Shard
from gateway.errors import InvalidRequest
from gateway.finished.results import Cursor, results_page
from gateway.json_codec import loads
from gateway.pipeline.finalizer import Finalizer
from gateway.pipeline.merge import seal_shard
from gateway.pipeline.shard_input import read_requests
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import order_key, shard_results_key
from gateway.store.order_index import read_entries
from gateway.store.records import BatchRecord, RequestCounts
from gateway.store.sqlite.coordination import SQLiteCoordination
from gateway.store.sqlite.store import SQLiteStore
from tests.support.sealed_batch import plan_lines

BATCH = "batch_r"


def _result(line: int, status: int) -> Result:
    return Result(line=line, custom_id=f"c{line}", status_code=status, body={"n": line}, model="m")


async def _page(store: SQLiteStore, blobs: LocalBlobs, after: str | None, limit: int) -> tuple[list[str], str, bool]:
    batch = await store.batches.get(BATCH)
    assert batch is not None
    page = await results_page(store, blobs, batch, Cursor.parse(after), limit)
    marks = [f"{(d := loads(raw))['kind'][0]}{d['custom_id']}" for raw in page.lines]
    return marks, str(page.cursor), page.has_more


async def _running_batch(store: SQLiteStore, blobs: LocalBlobs) -> list[Shard]:
    """A running batch of two shards (lines 1-3, 4-6) on route `m`, with its input and the planner's blob of
    where the shards' lines are (the finalizer reads the lines that never ran there)."""
    await store.batches.put(BatchRecord(id=BATCH, owner="team", endpoint="/v1/chat/completions",
                                        input_file_id="file_x", completion_window="24h",
                                        status=BatchStatus.IN_PROGRESS, created_at=1, expires_at=10**10))
    shards = [Shard(BATCH, 0, "m", 3), Shard(BATCH, 1, "m", 3)]
    await store.ledger.put_shards(BATCH, shards)
    await plan_lines(blobs, BATCH, [[1, 2, 3], [4, 5, 6]])
    await store.batches.update(BATCH, {"counts": RequestCounts(total=6), "shards_total": 2})
    return shards


async def test_pages_while_running_then_after_cancel(tmp_path: Path) -> None:
    store, blobs = SQLiteStore(tmp_path / "s.sqlite3"), LocalBlobs(tmp_path / "blobs")
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    try:
        shards = await _running_batch(store, blobs)
        assert await _page(store, blobs, None, 2) == ([], "0", False)
        await store.ledger.record_results(shards[0], [_result(2, 200)])
        await store.ledger.record_results(shards[1], [_result(5, 500)])
        await store.ledger.record_results(shards[0], [_result(1, 200), _result(2, 200)])  # 2 again: not new
        assert await _page(store, blobs, None, 2) == (["oc2", "ec5"], "2", True)
        assert await _page(store, blobs, "2", 2) == (["oc1"], "3", False)
        assert await _page(store, blobs, "3", 2) == ([], "3", False)

        # Cancelled: the finalizer seals lines 3, 4 and 6 as cancelled (seq 4, 5, 6) and merges.
        await store.batches.update(BATCH, {"status": BatchStatus.CANCELLING})
        await Finalizer(store, blobs, coordination, lambda route: None).finalize(BATCH)
        order = [tuple(entry) async for entry in read_entries(blobs, order_key(BATCH))]
        assert order == [(1, 3, True), (2, 1, True), (3, 4, False), (4, 5, False), (5, 2, False), (6, 6, False)]
        assert await store.ledger.logged(BATCH, 0, 10) == []  # the log is dropped once the files hold it
        assert await _page(store, blobs, "3", 2) == (["ec3", "ec4"], "3.5", True)
        assert await _page(store, blobs, "3.5", 2) == (["ec6"], "3.6", False)
        assert await _page(store, blobs, "3.6", 2) == ([], "3.6", False)
        assert await _page(store, blobs, None, 10) == (["oc1", "oc2", "ec3", "ec4", "ec5", "ec6"], "0.6", False)
    finally:
        await store.aclose()
        await coordination.aclose()


@pytest.mark.parametrize("text", ["x", "-1", "1.", "1.2.3", "1e3", "9" * 19])
def test_a_cursor_not_ours_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        Cursor.parse(text)


def test_cursors_read_back() -> None:
    assert [str(Cursor.parse(t)) for t in (None, "", "7", "7.3")] == ["0", "0", "7", "7.3"]


async def test_a_sealed_shards_results_leave_the_store_and_pages_read_them_from_its_blob(tmp_path: Path) -> None:
    store, blobs = SQLiteStore(tmp_path / "s.sqlite3"), LocalBlobs(tmp_path / "blobs")
    try:
        shards = await _running_batch(store, blobs)
        for shard, line, status in ((shards[0], 2, 200), (shards[1], 5, 500), (shards[0], 1, 200), (shards[0], 3, 200)):
            await store.ledger.record_results(shard, [_result(line, status)])  # seq 1, 2, 3, 4
        await seal_shard(store, blobs, shards[0], missing=None)
        # The store keeps only the unsealed shard's result; its lines are still where they are in the input.
        assert [(r.seq, r.line) for r in await store.ledger.logged(BATCH, 0, 10)] == [(2, 5)]
        assert await store.ledger.sealed_seqs(BATCH) == {0: (1, 4)}
        assert [r.line for r in await read_requests(blobs, shards[1]) or []] == [4, 5, 6]
        # The pages are the same as if the log held them all: by seq, across the log and the shard's blob.
        assert await _page(store, blobs, None, 2) == (["oc2", "ec5"], "2", True)
        assert await _page(store, blobs, "2", 10) == (["oc1", "oc3"], "4", False)
        await store.ledger.record_results(shards[1], [_result(4, 200)])  # seq 5
        assert await _page(store, blobs, "1", 3) == (["ec5", "oc1", "oc3"], "4", True)
        assert await _page(store, blobs, "4", 3) == (["oc4"], "5", False)
        # Merged into the batch's files and gone (the finalizer's part): an empty page, the same cursor; the
        # files answer once the batch reads finished.
        await blobs.delete(shard_results_key(shards[0]))
        assert await _page(store, blobs, "1", 3) == ([], "1", False)
    finally:
        await store.aclose()
