"""The results order index: the one module that writes and reads it.

The finalizer writes it beside a finished batch's output files (at `gateway.store.blobs.keys.order_key`): one
entry per result, in input order: its line, its seq and its kind (`o`: a 2xx reply, `e`: anything else;
`seq`: the number the ledger gave the result when it was journaled, 0 for a line answered at validation). The
results endpoint's cursor walks it beside the files, the retry picks its lines by it, and a `--retry-failed`
run rewrites it with the files it merges.

Its form (`IndexWriter`): gzip members, each the entries a writer was given (the merge writes one per
segment, and the segments are joined as they are), as text lines: the first `={line} {seq} {kind}`, each
next one what changed since the entry before, `{seq delta} {kind}` where the line is the next one, else
`+{line delta} {seq delta} {kind}`. A batch's results are journaled about in input order, so most entries
read `1 o` and the gzip member holds a few bytes per thousand of them: 4,000,000 entries of the first form
(`{line} {seq} {kind}`, still read) took 72.5 MB, a hundred times what the batch kept beside its files
otherwise. Memory, writing or reading: one chunk.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import NamedTuple

from gateway.store.protocols import Blobs
from gateway.store.splitter import prepended, split_lines

_GZIP = 16 + zlib.MAX_WBITS  # zlib's wbits for a gzip member
_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16


class OrderEntry(NamedTuple):
    line: int  # the input line's number (1, 2, … over every line, blank ones included)
    seq: int
    ok: bool  # a 2xx reply


class IndexWriter:
    """Entries, in input order, as one gzip member of the index: `add` and `end` return the bytes to write."""

    def __init__(self) -> None:
        self._zip = zlib.compressobj(6, zlib.DEFLATED, _GZIP)
        self._text = bytearray()
        self._last: tuple[int, int] | None = None

    def add(self, line: int, seq: int, ok: bool) -> bytes:
        kind = b"o" if ok else b"e"
        last = self._last
        if last is None:
            self._text += b"=%d %d %s\n" % (line, seq, kind)
        elif line == last[0] + 1:
            self._text += b"%d %s\n" % (seq - last[1], kind)
        else:
            self._text += b"+%d %d %s\n" % (line - last[0], seq - last[1], kind)
        self._last = (line, seq)
        if len(self._text) < _CHUNK:
            return b""
        packed = self._zip.compress(self._text)
        self._text.clear()
        return packed

    def end(self) -> bytes:
        """The member's last bytes (none when no entry was added: an empty index stays empty)."""
        if self._last is None:
            return b""
        return self._zip.compress(self._text) + self._zip.flush()


async def read_entries(blobs: Blobs, key: str) -> AsyncIterator[OrderEntry]:
    """The index at `key`, entry by entry, in either form (memory: a chunk)."""
    chunks = blobs.read(key)
    first = b""
    async for chunk in chunks:  # the form is in the first bytes, past any segment that holds none
        first += chunk
        if len(first) >= len(_MAGIC):
            break
    entries = _deltas(_inflated(first, chunks)) if first[:2] == _MAGIC else _first_form(prepended(first, chunks))
    async for entry in entries:
        yield entry


async def _first_form(text: AsyncIterator[bytes]) -> AsyncIterator[OrderEntry]:
    async for raw in split_lines(text):
        if isinstance(raw, bytes) and raw:
            line, seq, kind = raw.split()
            yield OrderEntry(int(line), int(seq), kind == b"o")


async def _deltas(text: AsyncIterator[bytes]) -> AsyncIterator[OrderEntry]:
    line = seq = 0
    async for raw in split_lines(text):
        if not isinstance(raw, bytes) or not raw:
            continue
        fields = raw.split()
        head = fields[0]
        if head[:1] == b"=":  # a member's first entry
            line, seq = int(head[1:]), int(fields[1])
        elif head[:1] == b"+":  # a line after a gap
            line, seq = line + int(head[1:]), seq + int(fields[1])
        else:
            line, seq = line + 1, seq + int(head)
        yield OrderEntry(line, seq, fields[-1] == b"o")


async def _inflated(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The gzip members' text, a chunk at a time (one member after another: the segments were joined)."""
    unzip = zlib.decompressobj(_GZIP)
    async for chunk in prepended(first, rest):
        data = chunk
        while True:
            out = unzip.decompress(data, _CHUNK)
            if out:
                yield out
            if unzip.eof:  # a member ended: the next one starts in what it left
                data = unzip.unused_data
                unzip = zlib.decompressobj(_GZIP)
                if not data:
                    break
            else:
                data = unzip.unconsumed_tail
                if not data and len(out) < _CHUNK:  # a full chunk out may leave more to come without input
                    break
    if not unzip.eof and (rest_of := unzip.flush()):
        yield rest_of


__all__ = ["IndexWriter", "OrderEntry", "read_entries"]
