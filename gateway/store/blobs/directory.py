"""The embedded `Blobs`: files in a local directory.

A blob is written to a temporary name and renamed into place on commit, so a
reader never sees half a file and a killed writer leaves no blob behind.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import BinaryIO

from gateway.store.blobs import commit_or_abort, composed
from gateway.store.protocols import BlobWriter


class LocalBlobWriter:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._size = 0

    async def write(self, data: bytes) -> None:
        self._file.write(data)
        self._size += len(data)

    async def commit(self) -> int:
        # In a thread: the fsync waits for the disk to take every byte still in the page cache (a 40 MB
        # Message Batch's lines stalled the API's loop for ~25 ms), and it lets go of the GIL meanwhile.
        await asyncio.to_thread(self._durable)
        return self._size

    def _durable(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self._path)

    async def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


class LocalBlobs:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"blob key escapes the store: {key!r}")
        return path

    def writer(self, key: str) -> LocalBlobWriter:
        return LocalBlobWriter(self._path(key))

    def writing(self, key: str) -> AbstractAsyncContextManager[BlobWriter]:
        return commit_or_abort(self.writer(key))

    def _resolved(self, key: str) -> str:
        """`key`, or its manifest when only that is there (`composed.manifest_of`)."""
        if composed.is_composed(key) or self._path(key).exists():
            return key
        whole = composed.manifest_of(key)
        return whole if self._path(whole).exists() else key

    def read(self, key: str, chunk_size: int = 1 << 16, *, start: int = 0,
             end: int | None = None) -> AsyncIterator[bytes]:
        key = self._resolved(key)
        if composed.is_composed(key):
            return composed.read(self._read_one, key, chunk_size, start, end)
        return self._read_one(key, chunk_size, start, end)

    async def _read_one(self, key: str, chunk_size: int, start: int = 0,
                        end: int | None = None) -> AsyncIterator[bytes]:
        with open(self._path(key), "rb") as f:
            if start:
                f.seek(start)
            left = None if end is None else max(end - start, 0)
            while left is None or left > 0:
                chunk = f.read(chunk_size if left is None else min(chunk_size, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    async def size(self, key: str) -> int | None:
        key = self._resolved(key)
        try:
            if composed.is_composed(key):
                return sum(size for _, size in await composed.parts_of(self._read_one, key))
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    async def delete(self, key: str, *, manifest: bool = True) -> None:
        if not composed.is_composed(key):
            if manifest:
                await self.delete(composed.manifest_of(key))
        elif self._path(key).exists():
            for part, _ in await composed.parts_of(self._read_one, key):
                self._path(part).unlink(missing_ok=True)
        self._path(key).unlink(missing_ok=True)

    async def compose(self, key: str, parts: Sequence[tuple[str, int]]) -> str:
        return await composed.write_manifest(self, key, parts)

    async def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

    async def discard_unfinished(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            for tmp in path.rglob(".*.tmp"):  # `LocalBlobWriter`'s name for a blob not yet committed
                tmp.unlink(missing_ok=True)

    async def aclose(self) -> None:
        return None
