"""A batch's input file outlives its record while an unfinished batch reads it.

Validation streams the input file, and a running batch's shards read their lines in it
(`gateway.pipeline.shard_input`): nothing copies it. A team may delete the file meanwhile (or it may expire),
as OpenAI lets it: its record goes at once (the file is 404 from then on, and its bytes no longer count against
the team's storage), and its bytes stay until the last unfinished batch reading them ends: `delete_file` leaves
them (`read_by`), and each batch, once it has ended, deletes them when their record is gone and no other
unfinished batch reads them (`release_input`).
"""

from __future__ import annotations

from gateway.store.blobs.keys import file_key
from gateway.store.protocols import Blobs, Store
from gateway.store.records import BatchRecord


async def read_by(store: Store, file_id: str, but: str | None = None) -> list[str]:
    """The unfinished batches (but `but`) whose input is the file `file_id`."""
    return [b.id for b in await store.batches.active()
            if b.input_file_id == file_id and b.id != but and not b.status.finished]


async def release_input(store: Store, blobs: Blobs, batch: BatchRecord) -> None:
    """Called once `batch` has ended (its finished status stored): its input file's bytes go if the file was
    deleted while it ran and no other unfinished batch reads them."""
    if await store.files.get(batch.input_file_id) is not None:
        return
    if not await read_by(store, batch.input_file_id, but=batch.id):
        # a batch created before the record kept the key: an upload's (an Upload's File names its own)
        await blobs.delete(batch.input_key or file_key(batch.input_file_id))


__all__ = ["read_by", "release_input"]
