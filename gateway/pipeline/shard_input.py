"""A shard's requests: where its lines are in the batch's input file, not a copy of them.

The planner (`gateway.pipeline.plan`) names each shard's lines as runs of adjacent input lines, one run a line
of text, `{first line number} {start} {end}` (byte offsets in the input, the end's newline left out), and
writes every shard's runs to one blob of the batch (`shard_lines_key`, `LinesWriter`): a first line naming the
form and the input file's blob, each shard's section as the shard is full (or at the end), then an index of
fixed-width entries (section start and end, by shard index) and a fixed-width trailer (how many shards, where
the index starts). A shard's section is found by its size and four small ranged reads (trailer, entry, first
line, section). One blob for the batch, not one per shard: a blob of about 50 bytes takes a disk block
(4 KiB) and, on S3, a request of its own, so 4,000
shards took 16 MB of disk and 4,000 PUTs during validation.

The runner reads the runs' bytes back with ranged reads (`Blobs.read`'s `start`/`end`: a seek on disk, a range
GET on S3, the parts it spans of a composed Upload) and rebuilds each request as the checker built it
(`validate.request_of`). So a batch's working blobs hold no copy of its input: a file of one model is one run
per shard; where models alternate line by line, a run per line (about 25 bytes against the line's hundreds).
The runs of one shard are read in windows: a gap of at most `GAP_BYTES` between two runs (other routes'
lines) is read through and dropped, a longer one is skipped by a new ranged read. Memory holds one run's bytes
at a time, and the shard's requests.

The blob stays until the batch ends, so a shard's lines are still there once it is sealed and merged: the
merge's checkpoint says which shards it merged (`gateway.pipeline.checkpoint`), and `read_requests` answers
None for them as for a shard whose lines are gone. Two forms of earlier versions are read as they are, so a
batch running across an upgrade finishes: a blob per shard (`shard_requests_key`) holding its runs under
`FORM_PER_SHARD`, or its requests themselves (one JSON request a line); that blob goes at the shard's seal.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.domain import BatchRequest, Shard
from gateway.json_codec import loads
from gateway.pipeline import checkpoint
from gateway.pipeline.validate import request_of
from gateway.store.blobs.keys import merge_checkpoint_key, shard_lines_key, shard_requests_key
from gateway.store.protocols import Blobs, BlobWriter
from gateway.store.splitter import read_lines

FORM = b"batchyard-shard-lines/2"  # the batch's one blob of every shard's runs
FORM_PER_SHARD = b"batchyard-shard-lines/1"  # a blob per shard (an earlier version's plan)
GAP_BYTES = 1 << 20  # other routes' bytes read through between two runs of a shard, at most
_ENTRY = b"%015d %015d\n"  # an index entry (a section's start and end), and the trailer (shards, index start)
_ENTRY_BYTES = 32
_HEAD_MAX = 4096  # the first line (the form and the input's key) is within this


class InputChanged(RuntimeError):
    """The input file ends before a run the plan named (it was replaced or cut): the shard cannot be read."""


@dataclass(slots=True)
class Run:
    """Input lines `first`, `first + 1`, … occupying the bytes [start, end) of the input file."""

    first: int
    start: int
    end: int


class ShardRuns:
    """An open shard's runs, as the planner meets its lines in input order (`add`): a few dozen bytes for a
    shard of one model's lines, about 25 a line where models alternate line by line."""

    def __init__(self) -> None:
        self._done = bytearray()
        self._run: Run | None = None
        self._next_line = 0

    def add(self, line: int, start: int, end: int) -> None:
        """Input line `line`, at bytes [start, end) of the input (its newline left out)."""
        run = self._run
        if run is not None and line == self._next_line and start == run.end + 1:
            run.end = end  # the line right after the run's last: the run takes it, newline and all
        else:
            self._end_run()
            self._run = Run(line, start, end)
        self._next_line = line + 1

    def encoded(self) -> bytes:
        """The runs as the blob holds them (the last one ended)."""
        self._end_run()
        return bytes(self._done)

    def _end_run(self) -> None:
        if self._run is not None:
            self._done += b"%d %d %d\n" % (self._run.first, self._run.start, self._run.end)
            self._run = None


class LinesWriter:
    """Writes the batch's blob of shard lines: `add` a shard's section once it is full (or the plan ends), then
    `close` with how many shards the plan made (a shard with no section, the lines answered in place, has an
    empty one). Holds each section's place, two integers a shard."""

    def __init__(self, writer: BlobWriter, input_key: str) -> None:
        head = FORM + b" " + input_key.encode() + b"\n"
        if len(head) > _HEAD_MAX:
            raise ValueError(f"an input key of {len(input_key)} characters")
        self._writer, self._head = writer, head
        self._at = 0
        self._sections: dict[int, tuple[int, int]] = {}

    async def add(self, index: int, runs: ShardRuns) -> None:
        if not self._at:
            await self._write(self._head)
        start = self._at
        await self._write(runs.encoded())
        self._sections[index] = (start, self._at)

    async def close(self, shards: int) -> None:
        if not self._at:
            await self._write(self._head)
        index_at = self._at
        for index in range(shards):
            await self._write(_ENTRY % self._sections.get(index, (0, 0)))
        await self._write(_ENTRY % (shards, index_at))

    async def _write(self, data: bytes) -> None:
        await self._writer.write(data)
        self._at += len(data)


async def read_requests(blobs: Blobs, shard: Shard) -> list[BatchRequest] | None:
    """The shard's requests in input order; None once it is sealed and merged, or its batch's blobs are gone."""
    found = await _section(blobs, shard)
    if found is None:
        return await _per_shard_requests(blobs, shard)
    if await _merged(blobs, shard):
        return None
    input_key, runs = found
    return [request async for request in _requests(blobs, input_key, runs)]


async def first_line(blobs: Blobs, shard: Shard) -> int | None:
    """The line number of the shard's first request (None: its lines are gone, so it is sealed now)."""
    found = await _section(blobs, shard)
    if found is None:
        return await _per_shard_first_line(blobs, shard)
    runs = found[1]
    return runs[0].first if runs else None


async def _merged(blobs: Blobs, shard: Shard) -> bool:
    """Whether the merge has every result of the shard in its written segments (then its results are gone)."""
    state = await checkpoint.load(blobs, merge_checkpoint_key(shard.batch_id))
    return state.composed or shard.index in state.merged


async def _section(blobs: Blobs, shard: Shard) -> tuple[str, list[Run]] | None:
    """The input's key and the shard's runs, from the batch's blob of shard lines; None: the batch has none
    (planned by an earlier version, or its blobs are gone)."""
    key = shard_lines_key(shard.batch_id)
    size = await blobs.size(key)
    if size is None:
        return None
    shards, index_at = _pair(await _range(blobs, key, size - _ENTRY_BYTES, size))
    if not 0 <= shard.index < shards:
        raise ValueError(f"shard {shard.key} is not among the {shards} shards of {key!r}")
    entry = index_at + _ENTRY_BYTES * shard.index
    start, end = _pair(await _range(blobs, key, entry, entry + _ENTRY_BYTES))
    head = (await _range(blobs, key, 0, min(_HEAD_MAX, index_at))).split(b"\n", 1)[0]
    if not head.startswith(FORM + b" "):
        raise ValueError(f"{key!r} is not a blob of shard lines")
    section = await _range(blobs, key, start, end) if end > start else b""
    return head[len(FORM) + 1:].decode(), [_run(raw) for raw in section.splitlines()]


async def _range(blobs: Blobs, key: str, start: int, end: int) -> bytes:
    return b"".join([chunk async for chunk in blobs.read(key, start=start, end=end)])


def _pair(raw: bytes) -> tuple[int, int]:
    first, second = raw.split()
    return int(first), int(second)


async def _per_shard_requests(blobs: Blobs, shard: Shard) -> list[BatchRequest] | None:
    try:  # read at once, not sized first: one request of the store per shard, not two
        lines = [raw async for raw in read_lines(blobs, shard_requests_key(shard)) if raw]
    except FileNotFoundError:
        return None
    if not lines or not lines[0].startswith(FORM_PER_SHARD + b" "):  # the form before runs: requests themselves
        return [BatchRequest.from_json(loads(raw)) for raw in lines]
    input_key = lines[0][len(FORM_PER_SHARD) + 1:].decode()
    runs = [_run(raw) for raw in lines[1:]]
    return [request async for request in _requests(blobs, input_key, runs)]


async def _per_shard_first_line(blobs: Blobs, shard: Shard) -> int | None:
    try:
        async with contextlib.aclosing(read_lines(blobs, shard_requests_key(shard))) as lines:
            async for raw in lines:
                if raw and not raw.startswith(FORM_PER_SHARD + b" "):
                    return _run(raw).first if raw[:1].isdigit() else BatchRequest.from_json(loads(raw)).line
    except FileNotFoundError:
        pass
    return None


def _run(raw: bytes) -> Run:
    first, start, end = raw.split()
    return Run(int(first), int(start), int(end))
async def _requests(blobs: Blobs, input_key: str, runs: list[Run]) -> AsyncIterator[BatchRequest]:
    async for run, data in _run_bytes(blobs, input_key, runs):
        for offset, raw in enumerate(data.split(b"\n")):
            yield request_of(raw, run.first + offset)


def _windows(runs: list[Run]) -> list[list[Run]]:
    """The runs in groups read by one ranged read each: a gap over `GAP_BYTES` starts a new one."""
    windows: list[list[Run]] = []
    for run in runs:
        if windows and run.start - windows[-1][-1].end <= GAP_BYTES:
            windows[-1].append(run)
        else:
            windows.append([run])
    return windows


async def _run_bytes(blobs: Blobs, key: str, runs: list[Run]) -> AsyncIterator[tuple[Run, bytes]]:
    """Each run with its bytes, read window by window; the gaps' bytes are dropped as they pass."""
    for window in _windows(runs):
        at = window[0].start  # the input offset of the next chunk's first byte
        pending = iter(window)
        run: Run | None = next(pending)
        taken = bytearray()
        async for chunk in blobs.read(key, start=window[0].start, end=window[-1].end):
            chunk_at, at = at, at + len(chunk)
            while run is not None:
                low, high = max(run.start - chunk_at, 0), min(run.end - chunk_at, len(chunk))
                if low < high:
                    taken += chunk[low:high]
                if run.end > at:
                    break  # the run goes on in the next chunk
                yield run, bytes(taken)
                taken.clear()
                run = next(pending, None)
        if run is not None:
            raise InputChanged(f"the input {key!r} ends at byte {at}, before line {run.first} (bytes "
                               f"{run.start}-{run.end})")


__all__ = ["FORM", "FORM_PER_SHARD", "GAP_BYTES", "InputChanged", "LinesWriter", "Run", "ShardRuns", "first_line",
           "read_requests"]
