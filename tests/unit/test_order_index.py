"""The results order index (`gateway.store.order_index`): what the merge writes is read back entry for entry.

Its entries are gzip members of small deltas, one member per merged segment, the segments joined as they are;
an index of the first form (a `{line} {seq} {kind}` line per entry), which finished batches of an older version
keep, is read as it is.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import segment_key
from gateway.store.order_index import IndexWriter, OrderEntry, read_entries

KEY = "results/batch_x.order"


def _entries(n: int, seed: int) -> list[OrderEntry]:
    """Lines in order with gaps (blank lines), seqs mostly one after another, some out of turn and some 0."""
    rng = random.Random(seed)
    entries, line = [], 0
    for seq in range(1, n + 1):
        line += 1 if rng.random() < 0.97 else rng.randint(2, 40)
        roll = rng.random()
        given = 0 if roll < 0.02 else seq + rng.randint(-300, 300) if roll < 0.1 else seq
        entries.append(OrderEntry(line, given, rng.random() < 0.9))
    return entries


async def _write(blobs: LocalBlobs, key: str, entries: list[OrderEntry]) -> int:
    index = IndexWriter()
    size = 0
    async with blobs.writing(key) as writer:
        for entry in entries:
            packed = index.add(*entry)
            await writer.write(packed)
            size += len(packed)
        packed = index.end()
        await writer.write(packed)
    return size + len(packed)


async def test_what_is_written_reads_back_entry_for_entry(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path)
    entries = _entries(50_000, seed=1)
    size = await _write(blobs, KEY, entries)
    assert [entry async for entry in read_entries(blobs, KEY)] == entries
    first_form = sum(len(b"%d %d o\n" % (e.line, e.seq)) for e in entries)
    assert size * 4 < first_form  # out-of-turn seqs and gaps on a tenth of them, and still a quarter at most


async def test_a_batch_journaled_in_input_order_takes_a_few_bytes_per_thousand_entries(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path)
    entries = [OrderEntry(n, n, True) for n in range(1, 200_001)]
    size = await _write(blobs, KEY, entries)
    assert size < 2_000  # the first form took 2.7 MB
    assert [entry async for entry in read_entries(blobs, KEY)] == entries


async def test_segments_written_apart_and_joined_read_as_one_index(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path)
    entries = _entries(30_000, seed=2)
    # segments of no entry (first and last: a merge that stopped before an open shard may write one), of one
    cuts = [0, 0, 1, 7_000, 7_001, 22_000, 30_000, 30_000]
    parts = []
    for number, (start, stop) in enumerate(itertools.pairwise(cuts)):
        key = segment_key(KEY, number)
        parts.append((key, await _write(blobs, key, entries[start:stop])))
    await blobs.compose(KEY, parts)
    assert [entry async for entry in read_entries(blobs, KEY)] == entries


async def test_an_index_of_the_first_form_is_read_as_it_is(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path)
    async with blobs.writing(KEY) as writer:
        await writer.write(b"1 3 o\n2 1 o\n4 0 e\n\n5 2 e\n")
    assert [tuple(entry) async for entry in read_entries(blobs, KEY)] == [
        (1, 3, True), (2, 1, True), (4, 0, False), (5, 2, False)]


async def test_an_empty_index_has_no_entries_and_no_bytes(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path)
    assert await _write(blobs, KEY, []) == 0
    assert [entry async for entry in read_entries(blobs, KEY)] == []
