"""Where the blobs live, as plain data: another process opens the same `Blobs` from it.

The composition root opens its own `Blobs` from a place, and hands the place (not the object, which holds
open clients) to the processes that validate uploads (`gateway.runtime.validation_processes`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gateway.store.protocols import Blobs

S3_ENDPOINT_ENV = "BATCHYARD_S3_ENDPOINT_URL"


@dataclass(frozen=True, slots=True)
class BlobPlace:
    """`location` (the CLI's `--blobs`): `s3://bucket/prefix` (S3, MinIO, moto) or a directory every process
    can reach.
    `endpoint_url`: a non-AWS S3 endpoint (default: `BATCHYARD_S3_ENDPOINT_URL`, then botocore's own)."""

    location: str
    endpoint_url: str | None = None

    @classmethod
    def of(cls, location: str | Path, *, endpoint_url: str | None = None) -> BlobPlace:
        return cls(str(location), endpoint_url or os.environ.get(S3_ENDPOINT_ENV) or None)

    def open(self) -> Blobs:
        if self.location.startswith("s3://"):
            from gateway.store.blobs.s3 import S3Blobs  # aiobotocore only where S3 is used

            return S3Blobs.from_url(self.location, endpoint_url=self.endpoint_url)
        from gateway.store.blobs.directory import LocalBlobs

        return LocalBlobs(Path(self.location))


__all__ = ["S3_ENDPOINT_ENV", "BlobPlace"]
