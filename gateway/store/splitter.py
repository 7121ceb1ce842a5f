"""Splitting a stream of byte chunks into lines, in time linear in the bytes and memory bounded by a cap.

`read_lines`: a blob's lines, read (`gateway.store.protocols.Blobs`);
`read_line_runs`: the same lines a run per chunk read, for a reader whose work per line is small enough
that an async iteration per line would be most of it (a Message Batch's results: 20,000 lines);
`prepended`: a stream with the bytes a reader took from its head to look at put back in front.

Each chunk is split once (in C); a line that spans chunks is kept as its pieces and joined once, when its
end arrives. Joining `rest + chunk` at every chunk instead copies a long line again and again: a 190 MB
line in 64 KiB chunks cost minutes. With `max_line`, a line's pieces are dropped as soon as it passes
the cap: it comes out as an `Overlong` (its size), in its place, and the lines after it come out as usual.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from gateway.store.protocols import Blobs


@dataclass(frozen=True, slots=True)
class Overlong:
    """A line longer than the cap, in its place: only its size was kept."""

    size: int


async def split_lines(chunks: AsyncIterable[bytes], max_line: int | None = None) -> AsyncIterator[bytes | Overlong]:
    """The lines of `chunks`, without their `\\n` (a last line without one too, unless empty); with
    `max_line`, a line of more bytes is an `Overlong`."""
    async for run in split_line_runs(chunks, max_line):
        for line in run:
            yield line


async def split_line_runs(chunks: AsyncIterable[bytes], max_line: int | None = None,
                          ) -> AsyncIterator[list[bytes | Overlong]]:
    """`split_lines`'s lines, as the runs of lines each chunk completes (none for a chunk that ends none)."""
    parts: list[bytes] = []  # the pieces of the line being read, while it is within the cap
    size = 0  # its bytes so far
    over = False
    async for chunk in chunks:
        pieces = chunk.split(b"\n")
        run: list[bytes | Overlong] = []
        for piece in pieces[:-1]:  # each ends a line
            size += len(piece)
            if over or (max_line is not None and size > max_line):
                run.append(Overlong(size))
            else:
                run.append(b"".join((*parts, piece)) if parts else piece)
            parts, size, over = [], 0, False
        if run:
            yield run
        tail = pieces[-1]
        size += len(tail)
        if over or not tail:
            continue
        if max_line is not None and size > max_line:
            parts, over = [], True  # stop buffering: from here on only its size is counted
        else:
            parts.append(tail)
    if over:
        yield [Overlong(size)]
    elif size:
        yield [b"".join(parts)]


async def read_lines(blobs: Blobs, key: str) -> AsyncGenerator[bytes, None]:
    """The lines of a blob, streamed, without their line ends (in linear time: `split_lines`)."""
    async for run in read_line_runs(blobs, key):
        for line in run:
            yield line


async def read_line_runs(blobs: Blobs, key: str) -> AsyncIterator[list[bytes]]:
    """The lines of a blob, without their line ends, as the runs of lines each chunk read completes."""
    async for run in split_line_runs(blobs.read(key)):
        yield cast("list[bytes]", run)  # without a cap, never an `Overlong`


async def prepended(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`first` (read ahead from the stream's head: its form, a blank file), then the rest of the stream."""
    if first:
        yield first
    async for chunk in rest:
        yield chunk


__all__ = ["Overlong", "prepended", "read_line_runs", "read_lines", "split_line_runs", "split_lines"]
