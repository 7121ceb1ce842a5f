"""The shared `Blobs`: objects in an S3 bucket (AWS, MinIO, moto…) through aiobotocore.

`s3://bucket/prefix` names the place; every blob key lands under the prefix.
Credentials and region come from the standard AWS environment variables and
config files only (botocore's own chain); `endpoint_url` (or botocore's
`AWS_ENDPOINT_URL_S3`) points at a non-AWS endpoint.

`compose` (a completed Upload, `gateway.store.blobs.composed`) joins parts into one object with S3's own
multipart upload, each part an `UploadPartCopy` of a part object done inside S3; parts S3 cannot take
(one under 5 MiB that is not the last, more than 10,000, one over 5 GiB) are joined by a manifest instead.

A writer buffers: a blob under `part_size` (≥ 5 MiB, S3's minimum part) is one
PutObject at `commit`; a larger one becomes a multipart upload whose parts go
out as the buffer fills, completed at `commit` and aborted at `abort`. Either
way the object appears whole or not at all, like the local store's rename.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlparse

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from gateway import crash_points
from gateway.store.blobs import commit_or_abort, composed
from gateway.store.protocols import BlobWriter

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_SIZE = 5 * 1024**3  # S3's bound on one part (and on one UploadPartCopy source)
MAX_PARTS = 10_000
_MISSING = {"404", "NoSuchKey", "NotFound"}


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
    return parsed.netloc, parsed.path.strip("/")


def _addressing(endpoint_url: str | None) -> dict[str, str] | None:
    """Path-style requests for a non-AWS endpoint (MinIO, moto: `bucket.host` names don't resolve there)."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and not (urlparse(endpoint).hostname or "").endswith("amazonaws.com"):
        return {"addressing_style": "path"}
    return None


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in _MISSING


class S3BlobWriter:
    def __init__(self, blobs: S3Blobs, key: str) -> None:
        self._blobs, self._key = blobs, key
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._size = 0

    async def write(self, data: bytes) -> None:
        self._buffer += data
        self._size += len(data)
        if len(self._buffer) >= self._blobs.part_size:
            await self._flush_part()

    async def _flush_part(self) -> None:
        client = await self._blobs.client()
        if self._upload_id is None:
            reply = await client.create_multipart_upload(Bucket=self._blobs.bucket, Key=self._key)
            self._upload_id = reply["UploadId"]
        number = len(self._parts) + 1
        reply = await client.upload_part(Bucket=self._blobs.bucket, Key=self._key, UploadId=self._upload_id,
                                         PartNumber=number, Body=bytes(self._buffer))
        self._parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        self._buffer.clear()

    async def commit(self) -> int:
        client = await self._blobs.client()
        if self._upload_id is None:
            await client.put_object(Bucket=self._blobs.bucket, Key=self._key, Body=bytes(self._buffer))
        else:
            if self._buffer:
                await self._flush_part()
            await client.complete_multipart_upload(Bucket=self._blobs.bucket, Key=self._key,
                                                   UploadId=self._upload_id, MultipartUpload={"Parts": self._parts})
        self._buffer.clear()
        return self._size

    async def abort(self) -> None:
        self._buffer.clear()
        if self._upload_id is not None:
            client = await self._blobs.client()
            with contextlib.suppress(ClientError):
                await client.abort_multipart_upload(Bucket=self._blobs.bucket, Key=self._key,
                                                    UploadId=self._upload_id)
            self._upload_id = None


class S3Blobs:
    def __init__(
        self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, part_size: int = 8 * 1024 * 1024,
        create_bucket: bool = False,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (S3's minimum part)")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.part_size = part_size
        self._endpoint_url = endpoint_url
        self._create_bucket = create_bucket
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._opening = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3Blobs:
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, **kwargs)

    async def client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._opening:
            if self._client is not None:
                return self._client
            config = AioConfig(max_pool_connections=64, s3=_addressing(self._endpoint_url))
            session = get_session()
            client = await self._stack.enter_async_context(
                session.create_client("s3", endpoint_url=self._endpoint_url, config=config)
            )
            if self._create_bucket:
                try:
                    await client.head_bucket(Bucket=self.bucket)
                except ClientError:
                    await client.create_bucket(Bucket=self.bucket)
            self._client = client
        return self._client

    def _key(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"blob key escapes the store: {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def writer(self, key: str) -> S3BlobWriter:
        return S3BlobWriter(self, self._key(key))

    def writing(self, key: str) -> AbstractAsyncContextManager[BlobWriter]:
        return commit_or_abort(self.writer(key))

    def read(self, key: str, chunk_size: int = 1 << 16, *, start: int = 0,
             end: int | None = None) -> AsyncIterator[bytes]:
        if composed.is_composed(key):
            return composed.read(self._read_one, key, chunk_size, start, end)
        return self._read_plain(key, chunk_size, start, end)

    async def _read_plain(self, key: str, chunk_size: int, start: int, end: int | None) -> AsyncIterator[bytes]:
        """`key`'s object, or its manifest's parts when only that is there (`composed.manifest_of`)."""
        started = False
        try:
            async for chunk in self._read_one(key, chunk_size, start, end):
                started = True
                yield chunk
            return
        except FileNotFoundError:
            if started or await self.size(composed.manifest_of(key)) is None:
                raise
        async for chunk in composed.read(self._read_one, composed.manifest_of(key), chunk_size, start, end):
            yield chunk

    async def _read_one(self, key: str, chunk_size: int, start: int = 0,
                        end: int | None = None) -> AsyncIterator[bytes]:
        if end is not None and end <= start:
            return  # S3 has no empty range
        client = await self.client()
        # a range GET (RFC 9110's `bytes=first-last`, the last byte included) reads only the bytes asked for
        ranged = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
        try:
            reply = await client.get_object(Bucket=self.bucket, Key=self._key(key), **ranged)
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(key) from None
            if ranged and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return  # a range from the object's end on: no bytes, as a file read there gives none
            raise
        async with reply["Body"] as body:
            async for chunk in body.iter_chunks(chunk_size):
                yield chunk

    async def size(self, key: str) -> int | None:
        if composed.is_composed(key):
            try:
                return sum(size for _, size in await composed.parts_of(self._read_one, key))
            except FileNotFoundError:
                return None
        client = await self.client()
        try:
            reply = await client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _missing(exc):
                return await self.size(composed.manifest_of(key))
            raise
        return int(reply["ContentLength"])

    async def delete(self, key: str, *, manifest: bool = True) -> None:
        """The blob; a manifest's parts with it; a plain key's manifest (and its parts) too, if there is one,
        unless `manifest=False`."""
        if not manifest and not composed.is_composed(key):
            await self._delete_object(key)
            return
        manifest_key = key if composed.is_composed(key) else composed.manifest_of(key)
        try:
            parts = await composed.parts_of(self._read_one, manifest_key)
        except FileNotFoundError:
            parts = []
        else:
            for part, _ in parts:
                await self._delete_object(part)
            await self._delete_object(manifest_key)
        if manifest_key != key:
            await self._delete_object(key)

    async def _delete_object(self, key: str) -> None:
        client = await self.client()
        await client.delete_object(Bucket=self.bucket, Key=self._key(key))

    async def compose(self, key: str, parts: Sequence[tuple[str, int]]) -> str:
        sizes = [size for _, size in parts]
        if not sizes or len(sizes) > MAX_PARTS or max(sizes) > MAX_PART_SIZE or min(sizes[:-1], default=MIN_PART_SIZE) \
                < MIN_PART_SIZE:
            return await composed.write_manifest(self, key, parts)
        client = await self.client()
        target = self._key(key)
        await self._abort_multipart(target, exact=True)  # a compose of this key that a kill cut short
        reply = await client.create_multipart_upload(Bucket=self.bucket, Key=target)
        upload_id = reply["UploadId"]
        try:
            done = []
            for number, (part, _) in enumerate(parts, 1):
                copied = await client.upload_part_copy(Bucket=self.bucket, Key=target, UploadId=upload_id,
                                                       PartNumber=number,
                                                       CopySource={"Bucket": self.bucket, "Key": self._key(part)})
                done.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
                crash_points.reached("blobs.s3.compose.part_copied")
            await client.complete_multipart_upload(Bucket=self.bucket, Key=target, UploadId=upload_id,
                                                   MultipartUpload={"Parts": done})
        except BaseException:
            with contextlib.suppress(ClientError):
                await client.abort_multipart_upload(Bucket=self.bucket, Key=target, UploadId=upload_id)
            raise
        return key

    async def delete_prefix(self, prefix: str) -> None:
        """Every blob under the folder `prefix` (as the local store removes a directory)."""
        client = await self.client()
        folder = self._key(prefix.rstrip("/")) + "/"
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=folder):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objects:  # a listing page holds at most 1000 keys, DeleteObjects' limit
                await client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        await self._abort_multipart(folder)

    async def discard_unfinished(self, prefix: str) -> None:
        await self._abort_multipart(self._key(prefix.rstrip("/")) + "/")

    async def _abort_multipart(self, prefix: str, *, exact: bool = False) -> None:
        """Abort the multipart uploads begun under `prefix` (at that very key: `exact`) and never completed:
        S3 keeps, and bills, their parts until they are."""
        client = await self.client()
        paginator = client.get_paginator("list_multipart_uploads")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                if exact and upload["Key"] != prefix:
                    continue
                with contextlib.suppress(ClientError):  # completed or aborted meanwhile
                    await client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                        UploadId=upload["UploadId"])

    async def aclose(self) -> None:
        self._client = None
        await self._stack.aclose()


__all__ = ["MAX_PARTS", "MAX_PART_SIZE", "MIN_PART_SIZE", "S3BlobWriter", "S3Blobs", "parse_s3_url"]
