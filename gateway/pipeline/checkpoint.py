"""What a merge under way has done, kept as a blob so that a finalizer run again goes on from it.

The merge (`gateway.pipeline.merge`) writes its files in segments and deletes each shard's results blob once
the shard's last result is in a written segment: the disk holds the output and about one segment beside it,
never a second copy of the output. A shard's results deleted are then only in the segments, so a finalizer
that died mid-way must not begin again: it reads this record (the segments written, their sizes, the shards
merged whole, how many results of each shard still open were merged, the counts so far) and goes on from
there. Written after each segment (`Blobs.writing`: whole or not at all), before the shards it merged are
deleted; a segment written after the last record is written again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.store.protocols import Blobs

_MAX_RECORD = 64 * 1024 * 1024  # a shard index and a count per open shard, a size per segment: far smaller


@dataclass(slots=True)
class MergeCheckpoint:
    segments: int = 0  # segments written whole (0 … segments-1)
    sizes: dict[str, list[int]] = field(default_factory=dict)  # per merged blob ("out", "err", "index"): bytes
    merged: set[int] = field(default_factory=set)  # shards whose every result is in a written segment
    read: dict[int, int] = field(default_factory=dict)  # shards open: results of each in the written segments
    summary: dict[str, Any] = field(default_factory=dict)  # `merge.Summary.state()` at the last segment
    composed: bool = False  # every merged blob is joined from its segments (only deletions are left)

    def to_json(self) -> bytes:
        return json.dumps({"segments": self.segments, "sizes": self.sizes, "merged": sorted(self.merged),
                           "read": {str(i): n for i, n in self.read.items()}, "summary": self.summary,
                           "composed": self.composed}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MergeCheckpoint:
        data = json.loads(raw)
        return cls(int(data["segments"]), {k: [int(n) for n in v] for k, v in data["sizes"].items()},
                   {int(i) for i in data["merged"]}, {int(i): int(n) for i, n in data["read"].items()},
                   data["summary"], bool(data["composed"]))


async def load(blobs: Blobs, key: str) -> MergeCheckpoint:
    """The record at `key`; a fresh one (nothing merged) if there is none."""
    if await blobs.size(key) is None:
        return MergeCheckpoint()
    raw = bytearray()
    async for chunk in blobs.read(key, 1 << 16):
        raw += chunk
        if len(raw) > _MAX_RECORD:
            raise ValueError(f"merge checkpoint {key!r} is too large")
    return MergeCheckpoint.from_json(bytes(raw))


async def save(blobs: Blobs, key: str, state: MergeCheckpoint) -> None:
    async with blobs.writing(key) as writer:
        await writer.write(state.to_json())


__all__ = ["MergeCheckpoint", "load", "save"]
