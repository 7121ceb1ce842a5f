"""`S3Blobs` (moto) answers as `LocalBlobs` does, `writing` included (a block that raises leaves no blob
behind), and a plain key with only its manifest there read, sized and deleted as the manifest; `S3Blobs`
alone: single PUT, multipart, abort, streamed read, prefix delete; each store's discarding of the writes a
killed process left unfinished; ranged reads alike on both, across the parts of a composed blob."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest

from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.s3 import S3Blobs
from gateway.store.protocols import Blobs
from tests.support.services import MotoS3
from tests.unit.test_shard_input import check_shards_read_back


@pytest.fixture(autouse=True)
def s3_env(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)


class _Boom(Exception):
    pass


async def _blobs(blobs: Blobs) -> list[Any]:
    """What a `Blobs` answers: `writing` commits at the end of its block, leaves nothing if it raises."""
    out: list[Any] = []

    async def read(key: str) -> bytes:
        return b"".join([chunk async for chunk in blobs.read(key, chunk_size=3)])

    async with blobs.writing("files/a") as w:
        await w.write(b"hello\n")
        out.append(await blobs.size("files/a"))  # nothing visible before the block ends
        await w.write(b"world\n")
    out.append([await blobs.size("files/a"), await read("files/a")])
    with pytest.raises(_Boom):
        async with blobs.writing("files/b") as w:
            await w.write(b"half")
            raise _Boom
    out.append(await blobs.size("files/b"))
    async with blobs.writing("batches/b1/x") as w:
        await w.write(b"1")
    async with blobs.writing("batches/b10/x") as w:
        await w.write(b"10")
    async with blobs.writing("files/empty"):
        pass
    out.append([await blobs.size("files/empty"), await read("files/empty")])
    for key, data in (("uploads/u/p1", b"abc"), ("uploads/u/p2", b"de")):
        async with blobs.writing(key) as w:
            await w.write(data)
    joined = await blobs.compose("uploads/u/file", [("uploads/u/p2", 2), ("uploads/u/p1", 3)])
    out.append([joined, await blobs.size(joined), await read(joined)])  # small parts: a manifest on both
    await blobs.delete(joined)
    out.append([await blobs.size("uploads/u/p1"), await blobs.size("uploads/u/p2")])  # its parts went with it
    # A plain key with only its manifest there (a merged output, written in segments) reads, sizes and deletes
    # as the manifest: readers spell the plain key.
    for key, data in (("files/o.seg0", b"ab\n"), ("files/o.seg1", b"cd\n")):
        async with blobs.writing(key) as w:
            await w.write(data)
    whole = await blobs.compose("files/o", [("files/o.seg0", 3), ("files/o.seg1", 3)])
    assert whole == "files/o.parts"
    out.append([await blobs.size("files/o"), await read("files/o")])
    # A plain key's own blob beside its manifest (an Upload joined both ways by a `complete` cut short): deleted
    # with `manifest=False`, the manifest and its parts stay, and the plain key reads as the manifest again.
    async with blobs.writing("files/o") as w:
        await w.write(b"stray\n")
    out.append(await read("files/o"))
    await blobs.delete("files/o", manifest=False)
    out.append([await blobs.size("files/o"), await read("files/o"), await blobs.size("files/o.seg0")])
    await blobs.delete("files/o")
    out.append([await blobs.size(key) for key in ("files/o", "files/o.parts", "files/o.seg0", "files/o.seg1")])
    await blobs.delete_prefix("batches/b1")
    out.append([await blobs.size("batches/b1/x"), await blobs.size("batches/b10/x")])
    await blobs.delete("files/a")
    out.append(await blobs.size("files/a"))
    with pytest.raises(FileNotFoundError):
        await read("files/a")
    with pytest.raises(ValueError):
        blobs.writing("../escape")
    return out


async def test_s3_blobs_answer_as_local_blobs_do(s3: MotoS3, tmp_path: Path) -> None:
    local, shared = LocalBlobs(tmp_path / "blobs"), S3Blobs.from_url(s3.location("parity"), endpoint_url=s3.url)
    try:
        expected = await _blobs(local)
        got = await _blobs(shared)
        client = await shared.client()
        assert not (await client.list_multipart_uploads(Bucket=s3.bucket)).get("Uploads")
    finally:
        await local.aclose()
        await shared.aclose()
    assert expected[0] is None and expected[1] == [12, b"hello\nworld\n"]
    assert expected[4] == ["uploads/u/file.parts", 5, b"deabc"] and expected[5] == [None, None]
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"step {i}"


async def _read_all(blobs: S3Blobs, key: str) -> bytes:
    return b"".join([chunk async for chunk in blobs.read(key)])


async def test_s3_blobs_put_multipart_abort_and_prefix_delete(s3: MotoS3) -> None:
    blobs = S3Blobs.from_url(s3.location("unit"), endpoint_url=s3.url, part_size=5 * 1024 * 1024)
    try:
        w = blobs.writer("files/small")
        await w.write(b"hello\n")
        await w.write(b"world\n")
        assert await blobs.size("files/small") is None  # nothing visible before commit
        assert await w.commit() == 12
        assert await _read_all(blobs, "files/small") == b"hello\nworld\n"
        assert await blobs.size("files/small") == 12

        big = hashlib.sha256()
        w = blobs.writer("batches/b1/shards/000000.results.jsonl")
        for i in range(12):  # 12 MiB in 1 MiB writes: three parts
            chunk = bytes([i]) * (1 << 20)
            big.update(chunk)
            await w.write(chunk)
        assert await w.commit() == 12 << 20
        got = hashlib.sha256()
        async for chunk in blobs.read("batches/b1/shards/000000.results.jsonl", chunk_size=1 << 18):
            got.update(chunk)
        assert got.hexdigest() == big.hexdigest()

        w = blobs.writer("files/aborted")
        await w.write(b"x" * (6 << 20))  # a part went out already
        await w.abort()
        client = await blobs.client()
        uploads = await client.list_multipart_uploads(Bucket=s3.bucket)
        assert not uploads.get("Uploads")
        assert await blobs.size("files/aborted") is None

        w = blobs.writer("batches/b10/x")
        await w.write(b"keep")
        await w.commit()
        left = blobs.writer("batches/b1/unfinished")  # as a killed process leaves it: a part out, never completed
        await left.write(b"x" * (6 << 20))
        await blobs.delete_prefix("batches/b1")
        assert not (await client.list_multipart_uploads(Bucket=s3.bucket)).get("Uploads")  # aborted with the folder
        assert await blobs.size("batches/b1/shards/000000.results.jsonl") is None
        assert await blobs.size("batches/b10/x") == 4  # a sibling with a longer name stays
        await blobs.delete("files/small")
        assert await blobs.size("files/small") is None
        with pytest.raises(FileNotFoundError):
            await _read_all(blobs, "files/small")
        with pytest.raises(ValueError):
            blobs.writer("../escape")
    finally:
        await blobs.aclose()


async def test_unfinished_writes_are_discarded_and_blobs_stay(s3: MotoS3, tmp_path: Path) -> None:
    """A writer neither committed nor aborted (its process killed): S3's multipart upload is aborted (S3 bills its
    parts until it is), the directory's temporary file removed; the folder's blobs, and other folders, stay."""
    shared = S3Blobs.from_url(s3.location("discard"), endpoint_url=s3.url, part_size=5 * 1024 * 1024)
    local = LocalBlobs(tmp_path / "blobs")
    try:
        for blobs in (shared, local):
            for key in ("uploads/u/kept", "uploads/w/other"):
                async with blobs.writing(key) as w:
                    await w.write(b"kept")
            for key in ("uploads/u/left", "uploads/w/running"):
                await blobs.writer(key).write(b"x" * (6 << 20))  # S3: a part out already
        client = await shared.client()
        begun = await client.list_multipart_uploads(Bucket=s3.bucket, Prefix="discard/")
        assert sorted(u["Key"] for u in begun["Uploads"]) == ["discard/uploads/u/left", "discard/uploads/w/running"]
        assert [p.name.endswith(".tmp") for p in (tmp_path / "blobs/uploads/u").iterdir()].count(True) == 1
        for blobs in (shared, local):
            await blobs.discard_unfinished("uploads/u")
            assert await blobs.size("uploads/u/kept") == 4 and await blobs.size("uploads/w/other") == 4
        begun = await client.list_multipart_uploads(Bucket=s3.bucket, Prefix="discard/")
        assert [u["Key"] for u in begun["Uploads"]] == ["discard/uploads/w/running"]  # another folder's
        assert [p.name for p in (tmp_path / "blobs/uploads/u").iterdir()] == ["kept"]
        assert len(list((tmp_path / "blobs/uploads/w").iterdir())) == 2
    finally:
        await shared.aclose()
        await local.aclose()


async def _ranged(blobs: Blobs) -> dict[str, bytes]:
    """Every range of a plain blob, of small parts joined by a manifest, and of a plain key that only its
    manifest stands for, across the parts' edges: what `read(start=, end=)` returns, by key and range."""
    data = bytes(range(256)) * 9  # 2,304 bytes
    cuts = [0, 700, 701, 1500, len(data)]  # a part of one byte among them
    async with blobs.writing("files/plain") as w:
        await w.write(data)
    parts = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        async with blobs.writing(f"uploads/r/p{i}") as w:
            await w.write(data[a:b])
        parts.append((f"uploads/r/p{i}", b - a))
    joined = await blobs.compose("uploads/r/file", parts)
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        async with blobs.writing(f"files/seg{i}") as w:
            await w.write(data[a:b])
    await blobs.compose("files/segmented", [(f"files/seg{i}", size) for i, (_, size) in enumerate(parts)])
    edges = sorted({0, 1, 699, 700, 701, 702, 1499, 1500, 1501, len(data) - 1, len(data)})
    got: dict[str, bytes] = {}
    for key in ("files/plain", joined, "files/segmented"):
        for start in edges:
            for end in [*(e for e in edges if e >= start), None]:
                read = b"".join([c async for c in blobs.read(key, chunk_size=97, start=start, end=end)])
                assert read == data[start:end], (key, start, end)
                got[f"{key} {start} {end}"] = read
    return got


async def test_ranged_reads_answer_alike_across_parts(s3: MotoS3, tmp_path: Path) -> None:
    """A shard reads its lines in the input file by range (`gateway.pipeline.shard_input`): each store gives
    exactly the bytes asked for, on a plain blob and across the parts of a composed one."""
    local, shared = LocalBlobs(tmp_path / "blobs"), S3Blobs.from_url(s3.location("ranges"), endpoint_url=s3.url)
    try:
        assert await _ranged(local) == await _ranged(shared)
    finally:
        await local.aclose()
        await shared.aclose()


async def test_ranged_reads_of_an_object_s3_joined(s3: MotoS3) -> None:
    """Parts big enough for S3's multipart are joined into one object inside S3: a range GET reads across them."""
    blobs = S3Blobs.from_url(s3.location("joined"), endpoint_url=s3.url, part_size=5 * 1024 * 1024)
    try:
        sizes = [5 << 20, 5 << 20, 1000]
        whole = b"".join(bytes([i + 1]) * size for i, size in enumerate(sizes))
        for i, size in enumerate(sizes):
            async with blobs.writing(f"uploads/j/p{i}") as w:
                await w.write(bytes([i + 1]) * size)
        key = await blobs.compose("files/joined", [(f"uploads/j/p{i}", s) for i, s in enumerate(sizes)])
        assert key == "files/joined"  # one object, not a manifest
        for start, end in (((5 << 20) - 3, (5 << 20) + 3), ((10 << 20) - 1, None), (0, 1)):
            read = b"".join([c async for c in blobs.read(key, start=start, end=end)])
            assert read == whole[start:end]
    finally:
        await blobs.aclose()


@pytest.mark.parametrize("parts", [1, 7])
async def test_shards_read_their_lines_from_an_input_in_s3(s3: MotoS3, parts: int) -> None:
    """The shard-input population (`tests/unit/test_shard_input.py`) over S3: an input object, and an Upload's
    parts cut mid-line joined by a manifest."""
    blobs = S3Blobs.from_url(s3.location(f"shards{parts}"), endpoint_url=s3.url)
    try:
        await check_shards_read_back(blobs, parts)
    finally:
        await blobs.aclose()
