"""A blob made of other blobs: an Upload's parts read as one file, nothing copied.

`POST /v1/uploads/{id}/complete` asks the blob store to compose the parts (`Blobs.compose`). The directory
store, and S3 for parts too small for its multipart (under 5 MiB but the last), write a small manifest (the
parts' keys and sizes, in order) at a key that ends in `SUFFIX`; every `Blobs` reads, sizes and deletes such
a key as the concatenation of its parts, so a completed Upload's bytes are written once (as its parts
arrived) and streamed in order by every reader (validation, the content route, the planners) without a
second copy. S3 with parts big enough joins them into one object by a multipart upload of server-side part
copies (`gateway.store.blobs.s3`): no byte passes through the gateway.

A plain key whose blob is absent but whose manifest (`key` + `SUFFIX`) is there reads, sizes and deletes as
that manifest (`manifest_of`): a batch's merged output, written in segments as its shards are merged
(`gateway.pipeline.merge`), keeps the key every reader spells (`keys.file_key`). Deleting a plain key deletes
its manifest and parts too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.store.protocols import Blobs

SUFFIX = ".parts"
_MAX_MANIFEST = 64 * 1024 * 1024  # 8 GB of 64 MB parts is 128 entries; any manifest of ours is far smaller

# (key, chunk_size, start, end): the bytes [start, end) of one plain blob (end None: to its end)
ReadOne = Callable[[str, int, int, int | None], AsyncIterator[bytes]]


def is_composed(key: str) -> bool:
    return key.endswith(SUFFIX)


def manifest_of(key: str) -> str:
    """Where the manifest of a plain `key` would be: read in its place when the key's own blob is absent."""
    return key + SUFFIX


def manifest(parts: Sequence[tuple[str, int]]) -> bytes:
    """The manifest of `parts` (key, bytes), in the order they are read."""
    return json.dumps({"parts": [{"key": key, "bytes": size} for key, size in parts]}).encode()


async def write_manifest(blobs: Blobs, key: str, parts: Sequence[tuple[str, int]]) -> str:
    """`Blobs.compose` by a manifest: at `key` + `SUFFIX`, the key returned."""
    at = key + SUFFIX
    async with blobs.writing(at) as writer:
        await writer.write(manifest(parts))
    return at


async def parts_of(read_one: ReadOne, key: str) -> list[tuple[str, int]]:
    raw = bytearray()
    async for chunk in read_one(key, 1 << 16, 0, None):
        raw += chunk
        if len(raw) > _MAX_MANIFEST:
            raise ValueError(f"blob manifest {key!r} is too large")
    return [(p["key"], int(p["bytes"])) for p in json.loads(raw)["parts"]]


async def read(read_one: ReadOne, key: str, chunk_size: int, start: int = 0,
               end: int | None = None) -> AsyncIterator[bytes]:
    """The parts' bytes in order; with `start`/`end`, only [start, end) of them (the parts it spans, each read
    from where the range enters it to where it leaves)."""
    at = 0
    for part, size in await parts_of(read_one, key):
        part_start, at = at, at + size
        if at <= start or size == 0:
            continue
        if end is not None and part_start >= end:
            return
        within = None if end is None or end >= at else end - part_start
        async for chunk in read_one(part, chunk_size, max(start - part_start, 0), within):
            yield chunk


__all__ = ["SUFFIX", "is_composed", "manifest", "manifest_of", "parts_of", "read", "write_manifest"]
