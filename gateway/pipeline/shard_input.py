"""A shard's requests: where its lines are in the batch's input file, not a copy of them.

The planner (`gateway.pipeline.plan`) writes each shard a small blob at `shard_requests_key`: a first line
naming the form and the input file's blob, then the shard's lines as runs of adjacent input lines, one run a
line of text, `{first line number} {start} {end}` (byte offsets in the input, the end's newline left out).
The runner reads the runs' bytes back with ranged reads (`Blobs.read`'s `start`/`end`: a seek on disk, a range
GET on S3, the parts it spans of a composed Upload) and rebuilds each request as the checker built it
(`validate.request_of`). So a batch's working blobs hold no copy of its input: a file of one model is one run
per shard (a few dozen bytes); where models alternate line by line, a run per line (about 25 bytes against the
line's own hundreds).

The runs of one shard are read in windows: a gap of at most `GAP_BYTES` between two runs (other routes'
lines) is read through and dropped, a longer one is skipped by a new ranged read. Memory holds one run's bytes
at a time, and the shard's requests (as it did when they were copied).

A shard planned by a version before this one holds its requests themselves (one JSON request a line): read as
they are (`read_requests`), so a batch running across an upgrade finishes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.domain import BatchRequest, Shard
from gateway.json_codec import loads
from gateway.pipeline.validate import request_of
from gateway.store.blobs.keys import shard_requests_key
from gateway.store.protocols import Blobs, BlobWriter
from gateway.store.splitter import read_lines

FORM = b"batchyard-shard-lines/1"
GAP_BYTES = 1 << 20  # other routes' bytes read through between two runs of a shard, at most


class InputChanged(RuntimeError):
    """The input file ends before a run the plan named (it was replaced or cut): the shard cannot be read."""


@dataclass(slots=True)
class Run:
    """Input lines `first`, `first + 1`, … occupying the bytes [start, end) of the input file."""

    first: int
    start: int
    end: int


class RunsWriter:
    """Writes a shard's blob as the planner meets its lines, in input order (`add`); `close` ends the last run."""

    def __init__(self, writer: BlobWriter, input_key: str) -> None:
        self._writer, self._input_key = writer, input_key
        self._run: Run | None = None
        self._next_line = 0
        self._started = False

    async def add(self, line: int, start: int, end: int) -> None:
        """Input line `line`, at bytes [start, end) of the input (its newline left out)."""
        run = self._run
        if run is not None and line == self._next_line and start == run.end + 1:
            run.end = end  # the line right after the run's last: the run takes it, newline and all
        else:
            await self._flush()
            self._run = Run(line, start, end)
        self._next_line = line + 1

    async def close(self) -> None:
        await self._flush()

    async def _flush(self) -> None:
        if not self._started:
            await self._writer.write(FORM + b" " + self._input_key.encode() + b"\n")
            self._started = True
        if self._run is not None:
            await self._writer.write(b"%d %d %d\n" % (self._run.first, self._run.start, self._run.end))
            self._run = None


async def read_requests(blobs: Blobs, shard: Shard) -> list[BatchRequest] | None:
    """The shard's requests in input order; None when its blob is gone (the shard was sealed)."""
    try:  # read at once, not sized first: one request of the store per shard, not two
        lines = [raw async for raw in read_lines(blobs, shard_requests_key(shard)) if raw]
    except FileNotFoundError:
        return None
    if not lines or not lines[0].startswith(FORM + b" "):  # a shard planned before runs: its requests themselves
        return [BatchRequest.from_json(loads(raw)) for raw in lines]
    input_key = lines[0][len(FORM) + 1:].decode()
    runs = [_run(raw) for raw in lines[1:]]
    return [request async for request in _requests(blobs, input_key, runs)]


async def first_line(blobs: Blobs, shard: Shard) -> int | None:
    """The line number of the shard's first request (None: its blob is gone, so it is sealed now)."""
    try:
        async with contextlib.aclosing(read_lines(blobs, shard_requests_key(shard))) as lines:
            async for raw in lines:
                if raw and not raw.startswith(FORM + b" "):
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


__all__ = ["FORM", "GAP_BYTES", "InputChanged", "Run", "RunsWriter", "first_line", "read_requests"]
