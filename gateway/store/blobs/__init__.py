"""File bytes by key (`gateway.store.protocols.Blobs`): in a local directory (`directory`) or S3 (`s3`);
`place`: where they live, as plain data another process opens them from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.store.protocols import BlobWriter


@asynccontextmanager
async def commit_or_abort(writer: BlobWriter) -> AsyncIterator[BlobWriter]:
    """`Blobs.writing`, for every implementation: commit when the block ends, abort when it raises
    (a half-written blob never appears, and a multipart upload is not left behind)."""
    try:
        yield writer
    except BaseException:
        await writer.abort()
        raise
    await writer.commit()


__all__ = ["commit_or_abort"]
