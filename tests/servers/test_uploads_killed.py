"""A `batchyard serve` SIGKILLed inside `POST /v1/uploads/{id}/complete`: while it streams the parts' md5, and at
each step between two durable writes (`gateway.crash_points`: the File composed, the File recorded, the first
part removed). Afterwards the Upload is `pending` with no File, and `complete` called again works; or it is
`completed` with its whole File. The parts the File does not read, and every part's record and quota, go: by
the next `complete`, or by the sweep (an Upload with no File at its expiry, one with its File at once). On S3 a
multipart compose the kill cut short is aborted, not left billed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import crash_points
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway
from tests.support.services import MotoS3, RedisServer
from tests.support.team_helpers import start_shared
from tests.support.waiting import eventually

PARTS = [bytes([97 + i]) * 3_000 for i in range(3)]
DATA = b"".join(PARTS)
ROOM = 1_000  # the storage left beside the File once its parts no longer count
POINTS = ("uploads.complete.composed", "uploads.complete.file_recorded", "uploads.complete.part_removed")


@pytest.fixture(scope="module")
def upstream() -> Any:
    with start_upstream() as server:
        yield server


def _create(gw: Gateway, size: int) -> str:
    body = {"filename": "in.jsonl", "purpose": "batch", "bytes": size, "mime_type": "application/jsonl"}
    reply = gw.http("POST", "/v1/uploads", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


def _part(gw: Gateway, upload_id: str, data: bytes) -> str:
    reply = gw.http("POST", f"/v1/uploads/{upload_id}/parts", files={"data": ("blob", data)})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


def _complete(gw: Gateway, upload_id: str, part_ids: list[str]) -> httpx.Response:
    return gw.http("POST", f"/v1/uploads/{upload_id}/complete", json={"part_ids": part_ids})


def _killed_in_complete(gw: Gateway) -> tuple[str, list[str]]:
    """An Upload of `PARTS` and one more part never named; its `complete` kills the server where the environment
    says."""
    upload_id = _create(gw, len(DATA))
    ids = [_part(gw, upload_id, part) for part in PARTS]
    _part(gw, upload_id, b"stray")  # sent again, say, and not named: not the File's
    with pytest.raises(httpx.TransportError):
        _complete(gw, upload_id, ids)
    assert gw.process.wait(10) == -signal.SIGKILL, gw.log()[-2000:]
    return upload_id, ids


def _start(upstream: Upstream, data_dir: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str | None,
           **settings: Any) -> Gateway:
    if crash_at is None:
        monkeypatch.delenv(crash_points.ENV, raising=False)
    else:
        monkeypatch.setenv(crash_points.ENV, crash_at)
    config = gateway_config(upstream, models=("gpt-mini",), max_file_storage_bytes=len(DATA) + ROOM, **settings)
    return start_gateway(config, data_dir, workers=0)


def _whole(gw: Gateway, folder: Path, ids: list[str]) -> None:
    """One File, of every part in order; beside its manifest only the parts it reads; the parts' quota free."""
    files = gw.client(None).files.list().data
    assert [f.bytes for f in files] == [len(DATA)]
    assert gw.http("GET", f"/v1/files/{files[0].id}/content").content == DATA
    assert sorted(p.name for p in folder.iterdir()) == sorted([*ids, "file.parts"])  # no stray part, no temp file
    assert gw.client(None).files.create(file=("f.jsonl", b"y" * ROOM), purpose="batch").bytes == ROOM


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_in_complete_then_complete_again(upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                point: str) -> None:
    with _start(upstream, tmp_path / "data", monkeypatch, point) as gw:
        upload_id, ids = _killed_in_complete(gw)
    folder = tmp_path / "data" / "blobs" / "uploads" / upload_id
    left = sorted(p.name for p in folder.iterdir())
    assert "file.parts" in left and len(left) >= 4, left  # the manifest and the parts (one gone at the last point)
    with _start(upstream, tmp_path / "data", monkeypatch, None) as gw:
        recorded = gw.client(None).files.list().data
        assert len(recorded) == (0 if point == "uploads.complete.composed" else 1)  # no File, or all of it
        again = _complete(gw, upload_id, ids)
        # The Upload was marked completed before the last point; after the second, the restarted server's first
        # sweep may finish it before this call does. Either way the File is the same.
        if point == "uploads.complete.part_removed" or (again.status_code == 409 and point != POINTS[0]):
            assert again.status_code == 409 and again.json()["error"]["code"] == "upload_already_completed"
        else:  # the answer the kill kept from the first call
            assert again.status_code == 200 and again.json()["status"] == "completed", again.text
            assert again.json()["file"]["bytes"] == len(DATA)
        _whole(gw, folder, ids)


def test_a_kill_after_the_file_then_cancel(upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `cancel` after the File was recorded finds the Upload completed (by itself or by the sweep before it):
    refused, and the File whole."""
    with _start(upstream, tmp_path / "data", monkeypatch, "uploads.complete.file_recorded") as gw:
        upload_id, ids = _killed_in_complete(gw)
    with _start(upstream, tmp_path / "data", monkeypatch, None) as gw:
        refused = gw.http("POST", f"/v1/uploads/{upload_id}/cancel")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "upload_completed", refused.text
        _whole(gw, tmp_path / "data" / "blobs" / "uploads" / upload_id, ids)


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_in_complete_then_the_sweep(upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           point: str) -> None:
    """Nobody calls `complete` again: a File recorded is finished by the sweep, never expired; an Upload with
    no File expires (twice its span after creation, its `complete` having begun) and takes every part."""
    with _start(upstream, tmp_path / "data", monkeypatch, point, upload_expiry_seconds=4) as gw:
        upload_id, ids = _killed_in_complete(gw)
    folder = tmp_path / "data" / "blobs" / "uploads" / upload_id
    with _start(upstream, tmp_path / "data", monkeypatch, None, upload_expiry_seconds=4) as gw:
        if point == "uploads.complete.composed":
            eventually(lambda: not folder.exists(), timeout=40, what="the expired Upload's folder gone")
            assert gw.client(None).files.list().data == []
            error = _complete(gw, upload_id, ids).json()["error"]
            assert error["code"] == "upload_expired", error
            big = gw.client(None).files.create(file=("f.jsonl", b"y" * (len(DATA) + ROOM)), purpose="batch")
            assert big.bytes == len(DATA) + ROOM  # nothing of the Upload counts any more
            return
        eventually(lambda: len(list(folder.iterdir())) == len(ids) + 1, timeout=40, what="the stray part gone")
        again = _complete(gw, upload_id, ids)
        assert again.status_code == 409 and again.json()["error"]["code"] == "upload_already_completed"
        _whole(gw, folder, ids)


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_a_kill_while_complete_reads_the_md5(upstream: Upstream, tmp_path: Path, delay: float) -> None:
    """The server is killed (SIGKILL) while `complete` streams the parts' md5: on restart the Upload is either
    completed or completes when asked again, and its File is every part, never half of them."""
    config = gateway_config(upstream, models=("gpt-mini",))
    parts = [bytes([97 + i]) * (6 << 20) for i in range(4)]
    data = b"".join(parts)
    with start_gateway(config, tmp_path / "data", workers=0) as gw:
        upload_id = _create(gw, len(data))
        ids = [_part(gw, upload_id, part) for part in parts]
        body = {"part_ids": ids, "md5": hashlib.md5(data).hexdigest()}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            sent = pool.submit(gw.http, "POST", f"/v1/uploads/{upload_id}/complete", json=body)
            time.sleep(delay)
            gw.kill()
            with contextlib.suppress(httpx.HTTPError):
                sent.result()
    with start_gateway(config, tmp_path / "data", workers=0) as gw:
        again = gw.http("POST", f"/v1/uploads/{upload_id}/complete", json=body)
        if again.status_code == 409:  # the first call got through
            assert again.json()["error"]["code"] == "upload_already_completed"
        else:
            assert again.status_code == 200 and again.json()["status"] == "completed", again.text
        files = gw.client(None).files.list().data
        assert len(files) == 1 and files[0].bytes == len(data)  # one File, made once
        content = gw.http("GET", f"/v1/files/{files[0].id}/content")
        assert content.status_code == 200 and content.content == data


@pytest.mark.parametrize("point", ["blobs.s3.compose.part_copied", "uploads.complete.file_recorded"])
def test_a_kill_in_an_s3_compose(upstream: Upstream, redis_server: RedisServer, s3: MotoS3, tmp_path: Path,
                                 point: str) -> None:
    """Parts S3's multipart takes: the kill leaves a multipart upload begun (one part copied) or the joined object
    and its File; `complete` again aborts the first, and leaves only the File's object."""
    config = gateway_config(upstream, models=("gpt-mini",))
    data = bytes(range(256)) * (10 << 12) + b"tail"  # two parts of 5 MiB, and 4 bytes
    parts = [data[:5 << 20], data[5 << 20: 10 << 20], data[10 << 20:]]
    prefix = f"killed-{point.split('.')[-1]}"
    with start_shared(config, tmp_path / "a", redis_server.url, blobs=s3.location(prefix),
                      env={**s3.env(), crash_points.ENV: point}) as gw:
        upload_id = _create(gw, len(data))
        ids = [_part(gw, upload_id, part) for part in parts]
        with pytest.raises(httpx.TransportError):
            _complete(gw, upload_id, ids)
        assert gw.process.wait(10) == -signal.SIGKILL
    folder = f"{prefix}/uploads/{upload_id}/"
    begun = s3.multipart_uploads(folder)
    assert begun == ([f"{folder}file"] if point.startswith("blobs.") else []), begun
    with start_shared(config, tmp_path / "b", redis_server.url, blobs=s3.location(prefix), env=s3.env()) as gw:
        again = _complete(gw, upload_id, ids)
        assert again.status_code == 200 and again.json()["status"] == "completed", again.text
        assert gw.client(None).files.content(again.json()["file"]["id"]).read() == data
        assert s3.multipart_uploads(folder) == []
        assert s3.keys(folder) == [f"{folder}file"]  # the parts copied into it are gone


def test_a_kill_after_an_s3_join_then_complete_in_another_order(upstream: Upstream, redis_server: RedisServer,
                                                                  s3: MotoS3, tmp_path: Path) -> None:
    """The kill comes after S3 joined the parts into one object, before the File; `complete` again names them in
    an order S3's multipart cannot take (a small part first): the File is a manifest of the parts, and the object
    the first call joined goes."""
    config = gateway_config(upstream, models=("gpt-mini",))
    parts = [b"a" * (5 << 20), b"b" * (5 << 20), b"tail"]
    prefix = "killed-reordered"
    with start_shared(config, tmp_path / "a", redis_server.url, blobs=s3.location(prefix),
                      env={**s3.env(), crash_points.ENV: "uploads.complete.composed"}) as gw:
        upload_id = _create(gw, sum(map(len, parts)))
        ids = [_part(gw, upload_id, part) for part in parts]
        with pytest.raises(httpx.TransportError):
            _complete(gw, upload_id, ids)
        assert gw.process.wait(10) == -signal.SIGKILL
    folder = f"{prefix}/uploads/{upload_id}/"
    assert f"{folder}file" in s3.keys(folder)  # joined, and no File of it
    with start_shared(config, tmp_path / "b", redis_server.url, blobs=s3.location(prefix), env=s3.env()) as gw:
        again = _complete(gw, upload_id, [ids[2], ids[0], ids[1]])
        assert again.status_code == 200, again.text
        assert gw.client(None).files.content(again.json()["file"]["id"]).read() == parts[2] + parts[0] + parts[1]
        assert s3.keys(folder) == sorted([f"{folder}file.parts", *(folder + i for i in ids)])
