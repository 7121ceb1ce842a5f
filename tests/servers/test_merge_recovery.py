"""A finalizer that dies mid-merge goes on from the merge's checkpoint, on a directory and on S3 (moto).

The merge deletes each shard's results once they are in a written segment, so the shards it merged exist
only in the segments: run again, the finalizer must not begin anew. Here it dies at a real fault of the blob
(the last shard's second result cannot be read), past two segments (shards 0-3 merged and deleted); with the
blob whole again, the finalizer run again writes every line once, in input order, with the counts whole, and
leaves no working blob (shards, checkpoint, S3 multipart uploads).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.pipeline.finalizer import Finalizer
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import merge_checkpoint_key, shard_results_key
from gateway.store.blobs.s3 import S3Blobs
from gateway.store.protocols import Blobs
from gateway.store.sqlite.coordination import SQLiteCoordination
from tests.support.sealed_batch import BATCH, PER_SHARD, SHARDS, output_ids, read_all, sealed_batch
from tests.support.services import MotoS3


@pytest.mark.parametrize("place", ["directory", "s3"])
async def test_a_finalizer_that_dies_mid_merge_goes_on_and_writes_the_whole_output_once(
        place: str, s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if place == "s3":
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        blobs: Blobs = S3Blobs.from_url(s3.location("merge"), endpoint_url=s3.url)
    else:
        blobs = LocalBlobs(tmp_path / "blobs")
    store, shards = await sealed_batch(tmp_path, blobs)
    coordination = SQLiteCoordination(tmp_path / "c.sqlite3", holder="test")
    finalizer = Finalizer(store, blobs, coordination, lambda route: None)
    try:
        broken = shard_results_key(shards[-1])
        whole = await read_all(blobs, broken)
        first, _, rest = whole.partition(b"\n")
        async with blobs.writing(broken) as writer:
            await writer.write(first + b"\n{\n" + rest)
        with pytest.raises(json.JSONDecodeError):
            await finalizer.finalize(BATCH)
        assert [await blobs.size(shard_results_key(s)) is None for s in shards] == [True] * 4 + [False] * 2
        state = json.loads(await read_all(blobs, merge_checkpoint_key(BATCH)))
        assert (state["segments"], state["merged"]) == (2, [0, 1, 2, 3])

        async with blobs.writing(broken) as writer:  # readable again: the finalizer goes on from its checkpoint
            await writer.write(whole)
        await finalizer.finalize(BATCH)
        assert await output_ids(store, blobs) == [f"c{line}" for line in range(1, SHARDS * PER_SHARD + 1)]
        batch = await store.batches.get(BATCH)
        assert batch is not None and (batch.counts.completed, batch.counts.failed) == (SHARDS * PER_SHARD, 0)
        assert batch.summary is not None and batch.summary["succeeded"] == SHARDS * PER_SHARD
        assert [await blobs.size(shard_results_key(s)) for s in shards] == [None] * SHARDS
        assert await blobs.size(merge_checkpoint_key(BATCH)) is None
        if isinstance(blobs, S3Blobs):
            client = await blobs.client()
            assert not (await client.list_multipart_uploads(Bucket=s3.bucket)).get("Uploads")
    finally:
        await store.aclose()
        await coordination.aclose()
        await blobs.aclose()
