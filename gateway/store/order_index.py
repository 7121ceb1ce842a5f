"""The results order index: the one module that writes and reads it.

The finalizer writes it beside a finished batch's output files (at `gateway.store.blobs.keys.order_key`): one
`{line} {seq} {o|e}` line per result, in input order (`o`: a 2xx reply, `e`: anything else; `seq`: the
number the ledger gave the result when it was journaled, 0 for a line answered at validation). The results
endpoint's cursor walks it beside the files, the retry picks its lines by it, and a `--retry-failed` run
rewrites it with the files it merges.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

from gateway.store.protocols import Blobs
from gateway.store.splitter import read_lines


class OrderEntry(NamedTuple):
    line: int  # the input line's number (1, 2, … over every line, blank ones included)
    seq: int
    ok: bool  # a 2xx reply


def entry_line(line: int, seq: int, ok: bool) -> bytes:
    """One entry, as the index holds it (with its newline)."""
    return b"%d %d %s\n" % (line, seq, b"o" if ok else b"e")


def parse_entry(raw: bytes) -> OrderEntry:
    line, seq, kind = raw.split()
    return OrderEntry(int(line), int(seq), kind == b"o")


async def read_entries(blobs: Blobs, key: str) -> AsyncIterator[OrderEntry]:
    """The index at `key`, entry by entry (one line in memory)."""
    async for raw in read_lines(blobs, key):
        if raw:
            yield parse_entry(raw)


__all__ = ["OrderEntry", "entry_line", "parse_entry", "read_entries"]
