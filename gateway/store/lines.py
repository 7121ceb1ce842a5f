"""Splitting a stream of byte chunks into lines, in time linear in the bytes and memory bounded by a cap.

Each chunk is split once (in C); a line that spans chunks is kept as its pieces and joined once, when its
end arrives. Joining `rest + chunk` at every chunk instead copies a long line again and again: a 190 MB
line in 64 KiB chunks cost minutes. With `max_line`, a line's pieces are dropped as soon as it passes
the cap: it comes out as an `Overlong` (its size), in its place, and the lines after it come out as usual.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Overlong:
    """A line longer than the cap, in its place: only its size was kept."""

    size: int


async def split_lines(chunks: AsyncIterable[bytes], max_line: int | None = None) -> AsyncIterator[bytes | Overlong]:
    """The lines of `chunks`, without their `\\n` (a last line without one too, unless empty); with
    `max_line`, a line of more bytes is an `Overlong`."""
    parts: list[bytes] = []  # the pieces of the line being read, while it is within the cap
    size = 0  # its bytes so far
    over = False
    async for chunk in chunks:
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:  # each ends a line
            size += len(piece)
            if over or (max_line is not None and size > max_line):
                yield Overlong(size)
            else:
                yield b"".join((*parts, piece)) if parts else piece
            parts, size, over = [], 0, False
        tail = pieces[-1]
        size += len(tail)
        if over or not tail:
            continue
        if max_line is not None and size > max_line:
            parts, over = [], True  # stop buffering: from here on only its size is counted
        else:
            parts.append(tail)
    if over:
        yield Overlong(size)
    elif size:
        yield b"".join(parts)


__all__ = ["Overlong", "split_lines"]
