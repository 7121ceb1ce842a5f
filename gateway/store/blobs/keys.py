"""Where each blob lives: the one place a blob key is spelled.

A file's bytes are `files/{file_id}` (its record keeps the key: `FileRecord.blob_key`); a batch's working
blobs (its shards' requests and results, the merge's checkpoint) are under `batches/{batch_id}/`, dropped
whole when it ends; what a finished batch leaves beside its output files (the results order index,
`gateway.store.order_index`) and what a `--retry-failed` run stages while it merges are under `results/`. A
merged output, error file or order index is its segments beside its key (`segment_key`), read through a
manifest at the key (`composed.manifest_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.domain import Shard


def file_key(file_id: str) -> str:
    """A file's bytes: an upload, or a batch's output or error file."""
    return f"files/{file_id}"


def batch_prefix(batch_id: str) -> str:
    """Every working blob of a batch (its shards'): deleted whole once the batch ends or fails validation."""
    return f"batches/{batch_id}"


def shard_lines_key(batch_id: str) -> str:
    """Where every shard's lines are in the batch's input file, written when the batch is planned
    (`gateway.pipeline.shard_input`)."""
    return f"{batch_prefix(batch_id)}/shards/lines"


def shard_requests_key(shard: Shard) -> str:
    """A shard's requests (or where they are in the input), a blob per shard: what earlier versions planned
    (`gateway.pipeline.shard_input` reads them; the seal deletes them)."""
    return f"{batch_prefix(shard.batch_id)}/shards/{shard.index:06d}.requests.jsonl"


def shard_results_key(shard: Shard) -> str:
    """A shard's sorted results, written once the shard is finished."""
    return f"{batch_prefix(shard.batch_id)}/shards/{shard.index:06d}.results.jsonl"


def merge_checkpoint_key(batch_id: str) -> str:
    """What a merge under way has done (`gateway.pipeline.checkpoint`): a finalizer run again goes on from it."""
    return f"{batch_prefix(batch_id)}/merge.json"


def segment_key(key: str, number: int) -> str:
    """One segment of a merged blob (an output or error file, an order index), written as its shards are merged;
    `key` is read as its segments (`composed.manifest_of`) once they are all written."""
    return f"{key}.seg{number:06d}"


def order_key(batch_id: str) -> str:
    """The results order index beside a finished batch's output files (`gateway.store.order_index`). It
    lives as long as the files: deleting either of them (or their expiry) deletes it."""
    return f"results/{batch_id}.order"


def retry_merged_key(retry_id: str) -> str:
    """The marker that a retry's results are merged into the first run's files (`gateway.finished.retry_merge`)."""
    return f"results/{retry_id}.merged"


def retry_staged_key(first_id: str, part: str) -> str:
    """A first run's merged `part` (output, errors, order), staged before it is copied into place."""
    return f"results/{first_id}.retry-{part}"


__all__ = ["batch_prefix", "file_key", "merge_checkpoint_key", "order_key", "retry_merged_key", "retry_staged_key",
           "segment_key", "shard_lines_key", "shard_requests_key", "shard_results_key"]
