"""OpenAI's Uploads API end to end: a real `batchyard serve`, the `openai` SDK's `upload_file_chunked` on every
path family, each error the spec names, expiry, a storage quota crossed mid-upload, and a batch of more than
50,000 lines made from an Upload. The S3 store's reading of a completed Upload runs against moto."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AzureOpenAI

from gateway.store.blobs import composed
from gateway.store.blobs.s3 import S3Blobs
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import (
    API_VERSION,
    Gateway,
    chat_line,
    gateway_config,
    jsonl,
    read_jsonl,
    start_gateway,
    wait_batch,
)
from tests.support.services import MotoS3, RedisServer
from tests.support.team_helpers import start_shared
from tests.support.waiting import eventually

ALPHA, BETA, GAMMA = "sk-up-alpha", "sk-up-beta", "sk-up-gamma"
GAMMA_STORAGE = 4_000
BIG = 50_001  # lines of the batch past OpenAI's 50,000


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams: list[dict[str, Any]] = [
        {"team_id": "alpha", "api_keys": [ALPHA], "max_lines": BIG},  # raised for alpha alone
        {"team_id": "beta", "api_keys": [BETA]},
        {"team_id": "gamma", "api_keys": [GAMMA], "max_file_storage_bytes": GAMMA_STORAGE}]
    config = gateway_config(upstream, models=("gpt-mini",), teams=teams, max_upload_bytes=10**8,
                            shard_size=5_000, max_concurrency=64)
    # The big batch's lines go as the upstream's own batch jobs (a job per shard, answered inside the stand-in):
    # the same upload, plan, shards and merge as a real-time route, without 50,001 HTTP calls.
    config["model_list"].append({"model_name": "gpt-bulk", "litellm_params": {
        "model": "openai/gpt-bulk", "api_base": upstream.v1_url, "api_key": upstream.api_key},
        "model_info": {"batch_mode": "native", "native_poll_initial_seconds": 0.1, "native_poll_max_seconds": 0.3}})
    with start_gateway(config, tmp_path_factory.mktemp("uploads") / "data") as gateway:
        yield gateway


def _lines(n: int, tag: str) -> bytes:
    return jsonl(chat_line(f"{tag}-{i}", "gpt-mini", f"{tag} {i}") for i in range(n))


def _post(gw: Gateway, path: str, key: str = ALPHA, **kwargs: Any) -> httpx.Response:
    return gw.http("POST", path, key, **kwargs)


def _create(gw: Gateway, size: int, key: str = ALPHA, **extra: Any) -> dict[str, Any]:
    body = {"filename": "in.jsonl", "purpose": "batch", "bytes": size, "mime_type": "application/jsonl", **extra}
    reply = _post(gw, "/v1/uploads", key, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _part(gw: Gateway, upload_id: str, data: bytes, key: str = ALPHA) -> httpx.Response:
    return _post(gw, f"/v1/uploads/{upload_id}/parts", key, files={"data": ("blob", data)})


def _error(reply: httpx.Response, status: int, code: str | None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape; `code` None: any code (the type and message are still checked)."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"], error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


# --------------------------------------------------------------------------- the SDK, every path family


@pytest.mark.parametrize("prefix", ["/v1", "", "/openai/v1", "/azure/v1"])
def test_sdk_chunked_upload_on_every_path_family(gw: Gateway, prefix: str) -> None:
    data = _lines(40, f"fam{prefix.replace('/', '-')}")
    client = gw.client(ALPHA, prefix=prefix)
    upload = client.uploads.upload_file_chunked(file=data, filename="in.jsonl", bytes=len(data),
                                                mime_type="application/jsonl", purpose="batch",
                                                part_size=len(data) // 3 + 1, md5=hashlib.md5(data).hexdigest())
    assert upload.status == "completed" and upload.object == "upload" and upload.bytes == len(data)
    assert upload.file is not None and upload.file.bytes == len(data) and upload.file.filename == "in.jsonl"
    assert upload.expires_at == upload.created_at + 3600
    assert client.files.content(upload.file.id).read() == data  # the parts, in order, as one file
    assert client.files.retrieve(upload.file.id).purpose == "batch"


def test_sdk_chunked_upload_from_a_path_with_azure(gw: Gateway, tmp_path: Path) -> None:
    data = _lines(30, "azure")
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    azure = AzureOpenAI(azure_endpoint=gw.url, api_key=ALPHA, api_version=API_VERSION, max_retries=0)
    upload = azure.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="batch",
                                               part_size=1000)
    assert upload.status == "completed" and upload.file is not None and upload.filename == "in.jsonl"
    assert azure.files.content(upload.file.id).read() == data
    batch = azure.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    done = wait_batch(azure, batch.id)  # type: ignore[arg-type]
    assert done.status == "completed" and done.request_counts and done.request_counts.completed == 30


_OPENAI2_UPLOAD = """
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
data = b"".join(json.dumps({"custom_id": f"v2-{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": "hi"}]}}).encode()
                + b"\\n" for i in range(20))
up = client.uploads.upload_file_chunked(file=data, filename="v2.jsonl", bytes=len(data),
                                        mime_type="application/jsonl", purpose="batch", part_size=500)
same = client.files.content(up.file.id).read() == data
print(json.dumps({"version": openai.__version__, "status": up.status, "same": same}))
"""


def test_sdk_2x_chunked_upload(gw: Gateway, tmp_path: Path) -> None:
    """Teams still on the 2.x SDK (scripts/test.sh installs it into BATCHYARD_OPENAI2) upload in parts too."""
    folder = os.environ.get("BATCHYARD_OPENAI2", "")
    if not folder or not Path(folder, "openai").is_dir():
        if os.environ.get("CI"):
            pytest.fail("BATCHYARD_OPENAI2 (openai 2.x, installed by scripts/test.sh) is missing")
        pytest.skip("openai 2.x is installed by scripts/test.sh (BATCHYARD_OPENAI2)")
    script = tmp_path / "upload2.py"
    script.write_text(_OPENAI2_UPLOAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(script), gw.url + "/v1", ALPHA], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"version": result["version"], "status": "completed", "same": True}
    assert result["version"].startswith("2.")


# --------------------------------------------------------------------------- the spec's errors


def test_create_refusals(gw: Gateway) -> None:
    good = {"filename": "a.jsonl", "purpose": "batch", "bytes": 10, "mime_type": "application/jsonl"}
    _error(_post(gw, "/v1/uploads", json={**good, "colour": "red"}), 400, "unknown_parameter", "colour")
    _error(_post(gw, "/v1/uploads", json={k: v for k, v in good.items() if k != "filename"}), 400,
           "missing_required_parameter", "filename")
    _error(_post(gw, "/v1/uploads", json={**good, "bytes": "10"}), 400, None, "bytes")
    _error(_post(gw, "/v1/uploads", json={**good, "purpose": "nonsense"}), 400, "invalid_value", "purpose")
    _error(_post(gw, "/v1/uploads", json={**good, "bytes": 10**8 + 1}), 400, "upload_too_large", "bytes")
    _error(_post(gw, "/v1/uploads", json={**good, "expires_after": {"anchor": "created_at", "seconds": 5}}), 400,
           None)
    _error(_post(gw, "/v1/uploads", content=b"[1]", headers={"content-type": "application/json"}), 400,
           "invalid_json")
    _error(_post(gw, "/v1/uploads", "sk-nobody", json=good), 401, None)


# per purpose: types taken (a type's parameters and case aside; a bare subtype, as the SDK's own example writes
# `mime_type="pdf"`), and types refused
MIME_TAKEN = {"batch": ["application/jsonl", "text/jsonl", "application/x-ndjson", "Application/JSONL; charset=utf-8",
                        "jsonl"],
              "fine-tune": ["application/jsonl", "jsonl"], "evals": ["application/jsonl", "text/jsonl"],
              "vision": ["image/png", "image/jpeg", "png"],
              "assistants": ["application/pdf", "text/markdown", "pdf", "python", "image/png"],
              "user_data": ["application/octet-stream", "video/mp4", "bin"]}
MIME_REFUSED = {"batch": ["text/plain", "application/json", "pdf", "application/jsonl-not"],
                "fine-tune": ["text/csv"], "evals": ["image/png"], "vision": ["application/pdf", "image/svg+xml"],
                "assistants": ["application/jsonl", "video/mp4"], "user_data": ["not a type", "a/b/c"]}


@pytest.mark.parametrize("purpose", sorted(MIME_TAKEN))
def test_mime_type_falls_within_its_purposes_types(gw: Gateway, purpose: str) -> None:
    for mime in MIME_TAKEN[purpose]:
        assert _create(gw, 4, purpose=purpose, mime_type=mime)["purpose"] == purpose
    for mime in MIME_REFUSED[purpose]:
        body = {"filename": "a.jsonl", "purpose": purpose, "bytes": 4, "mime_type": mime}
        error = _error(_post(gw, "/v1/uploads", json=body), 400, "invalid_value", "mime_type")
        assert error["message"].startswith(f"Invalid value: '{mime}'."), error
    if purpose == "batch":
        assert error["message"].endswith("Supported values are: 'application/jsonl', 'application/x-jsonl', "
                                         "'application/jsonlines', 'application/x-jsonlines', "
                                         "'application/x-ndjson', and 'text/jsonl'."), error


def test_sdk_chunked_upload_refused_for_its_mime_type(gw: Gateway) -> None:
    """The SDK's chunked upload with `mime_type` as its own example writes it, and with a type `batch` does not
    take: OpenAI's 400 before a part is sent."""
    data = _lines(3, "mime")
    client = gw.client(ALPHA)
    for mime in ("jsonl", "text/jsonl"):
        upload = client.uploads.upload_file_chunked(file=data, filename="in.jsonl", bytes=len(data), mime_type=mime,
                                                    purpose="batch")
        assert upload.status == "completed" and upload.file is not None
        assert client.files.content(upload.file.id).read() == data
    with pytest.raises(openai.BadRequestError) as refused:
        client.uploads.upload_file_chunked(file=data, filename="in.txt", bytes=len(data), mime_type="text/plain",
                                           purpose="batch")
    assert refused.value.code == "invalid_value" and refused.value.param == "mime_type"


def test_expires_after_gives_the_file_its_expiry(gw: Gateway) -> None:
    up = _create(gw, 4, expires_after={"anchor": "created_at", "seconds": 7200})
    part = _part(gw, up["id"], b"abcd").json()
    done = _post(gw, f"/v1/uploads/{up['id']}/complete", json={"part_ids": [part["id"]]}).json()
    assert done["file"]["expires_at"] == done["file"]["created_at"] + 7200


def test_another_teams_upload_is_not_found(gw: Gateway) -> None:
    up = _create(gw, 4)
    part = _part(gw, up["id"], b"abcd")
    assert part.status_code == 200 and part.json()["object"] == "upload.part"
    assert part.json()["upload_id"] == up["id"]
    for path, kwargs in ((f"/v1/uploads/{up['id']}/parts", {"files": {"data": ("b", b"x")}}),
                         (f"/v1/uploads/{up['id']}/complete", {"json": {"part_ids": [part.json()["id"]]}}),
                         (f"/v1/uploads/{up['id']}/cancel", {})):
        _error(_post(gw, path, BETA, **kwargs), 404, "not_found")
    _error(_post(gw, "/v1/uploads/upload_missing/cancel"), 404, "not_found")
    _error(_post(gw, "/v1/uploads/file-abc/cancel"), 400, "invalid_id", "upload_id")
    # still alpha's, untouched
    done = _post(gw, f"/v1/uploads/{up['id']}/complete", json={"part_ids": [part.json()["id"]]})
    assert done.status_code == 200 and done.json()["status"] == "completed"
    _error(gw.http("GET", f"/v1/files/{done.json()['file']['id']}", BETA), 404, "not_found")


def test_complete_refusals(gw: Gateway) -> None:
    up, other = _create(gw, 8), _create(gw, 4)
    p1, p2 = (_part(gw, up["id"], b"abcd").json()["id"], _part(gw, up["id"], b"efgh").json()["id"])
    foreign = _part(gw, other["id"], b"wxyz").json()["id"]
    complete = f"/v1/uploads/{up['id']}/complete"
    _error(_post(gw, complete, json={"part_ids": [p1]}), 400, "bytes_mismatch", "part_ids")
    _error(_post(gw, complete, json={"part_ids": [p1, foreign]}), 400, "invalid_part", "part_ids[1]")
    _error(_post(gw, complete, json={"part_ids": [p1, p1]}), 400, "duplicate_part", "part_ids")
    _error(_post(gw, complete, json={"part_ids": [p1, p2], "md5": "0" * 32}), 400, "md5_mismatch", "md5")
    _error(_post(gw, complete, json={"part_ids": [p1, p2], "extra": 1}), 400, "unknown_parameter", "extra")
    _error(_post(gw, complete, json={}), 400, None, "part_ids")
    # the parts in the order named: the second part first
    done = _post(gw, complete, json={"part_ids": [p2, p1], "md5": hashlib.md5(b"efghabcd").hexdigest()})
    assert done.status_code == 200, done.text
    assert gw.client(ALPHA).files.content(done.json()["file"]["id"]).read() == b"efghabcd"
    _error(_post(gw, complete, json={"part_ids": [p2, p1]}), 409, "upload_already_completed")
    _error(_part(gw, up["id"], b"more"), 409, "upload_completed")


def test_part_refusals(gw: Gateway) -> None:
    up = _create(gw, 4)
    _error(_part(gw, up["id"], b"12345"), 400, "upload_too_large", "data")  # past the Upload's own `bytes`
    reply = _post(gw, f"/v1/uploads/{up['id']}/parts", files={"file": ("b", b"12")})
    _error(reply, 400, "unknown_parameter", "file")
    _error(_post(gw, f"/v1/uploads/{up['id']}/parts", data={}, files={}), 400, "invalid_content_type")
    # a part over 64 MB, streamed (no Content-Length): refused as the 64 MB are passed
    def streamed() -> Iterator[bytes]:
        yield b'--x\r\nContent-Disposition: form-data; name="data"; filename="b"\r\n\r\n'
        for _ in range(65):
            yield b"y" * (1 << 20)
        yield b"\r\n--x--\r\n"

    headers = {"content-type": "multipart/form-data; boundary=x"}
    big = _create(gw, 70 * (1 << 20))
    _error(_post(gw, f"/v1/uploads/{big['id']}/parts", content=streamed(), headers=headers), 413, "part_too_large")
    folder = gw.data_dir / "blobs" / "uploads" / big["id"]
    assert not folder.exists() or not list(folder.iterdir())  # nothing of it kept


def test_cancel_removes_the_parts(gw: Gateway) -> None:
    up = _create(gw, 8)
    _part(gw, up["id"], b"abcd")
    folder = gw.data_dir / "blobs" / "uploads" / up["id"]
    assert len(list(folder.iterdir())) == 1
    cancelled = _post(gw, f"/v1/uploads/{up['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert not folder.exists()  # the Upload's folder, parts and all
    _error(_part(gw, up["id"], b"efgh"), 409, "upload_cancelled")
    _error(_post(gw, f"/v1/uploads/{up['id']}/complete", json={"part_ids": []}), 409, "upload_cancelled")


def test_storage_quota_crossed_mid_upload(gw: Gateway) -> None:
    """gamma may store 4,000 bytes: parts count as they arrive, and cancelling frees them."""
    up = _create(gw, 6_000, GAMMA)
    for _ in range(3):
        assert _part(gw, up["id"], b"x" * 1_200, GAMMA).status_code == 200
    _error(_part(gw, up["id"], b"x" * 1_200, GAMMA), 429, "storage_quota_exceeded")
    client = gw.client(GAMMA)
    with pytest.raises(openai.RateLimitError) as refused:
        client.files.create(file=("f.jsonl", b"y" * 1_000), purpose="batch")
    assert refused.value.code == "storage_quota_exceeded"
    assert _post(gw, f"/v1/uploads/{up['id']}/cancel", GAMMA).status_code == 200
    assert client.files.create(file=("f.jsonl", b"y" * 3_000), purpose="batch").bytes == 3_000


# --------------------------------------------------------------------------- expiry


def test_an_abandoned_upload_expires_and_its_parts_go(upstream: Upstream, tmp_path: Path) -> None:
    config = gateway_config(upstream, models=("gpt-mini",), upload_expiry_seconds=2,
                            max_file_storage_bytes=1_000)
    with start_gateway(config, tmp_path / "data", workers=0) as gw:
        up = _create(gw, 1_000, None)  # type: ignore[arg-type]
        assert up["expires_at"] == up["created_at"] + 2 and up["status"] == "pending"
        part = _part(gw, up["id"], b"z" * 900, None)  # type: ignore[arg-type]
        folder = gw.data_dir / "blobs" / "uploads" / up["id"]
        assert len(list(folder.iterdir())) == 1
        eventually(lambda: not folder.exists() or not list(folder.iterdir()), timeout=30, what="the parts' removal")
        reply = gw.http("POST", f"/v1/uploads/{up['id']}/complete", json={"part_ids": [part.json()["id"]]})
        _error(reply, 409, "upload_expired")
        # the expired parts no longer count: the whole quota is free again
        assert gw.client(None).files.create(file=("f.jsonl", b"y" * 1_000), purpose="batch").bytes == 1_000


# --------------------------------------------------------------------------- a batch past 50,000 lines


def test_a_batch_of_more_than_50000_lines_from_an_upload(gw: Gateway, upstream: Upstream) -> None:
    """alpha's `max_lines` is raised past OpenAI's 50,000: one batch runs the whole file, in input order, its
    shards each an upstream job of the native route."""
    data = jsonl({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "gpt-bulk", "messages": [{"role": "user", "content": "k"}], "max_tokens": 1}}
                 for i in range(BIG))
    jobs_before = upstream.stats()["batches_created"]
    client = gw.client(ALPHA)
    upload = client.uploads.upload_file_chunked(file=data, filename="big.jsonl", bytes=len(data),
                                                mime_type="application/jsonl", purpose="batch",
                                                part_size=2 * 1024 * 1024)
    assert upload.file is not None
    batch = client.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait_batch(client, batch.id, timeout=900)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == BIG
    out = read_jsonl(client, done.output_file_id)
    assert [o["custom_id"] for o in out] == [f"b{i}" for i in range(BIG)]  # one output, in input order
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert upstream.stats()["batches_created"] - jobs_before == -(-BIG // 5_000)  # a job per shard
    # another team keeps OpenAI's 50,000
    other = gw.client(BETA)
    upload = other.uploads.upload_file_chunked(file=data, filename="big.jsonl", bytes=len(data),
                                               mime_type="application/jsonl", purpose="batch",
                                               part_size=2 * 1024 * 1024)
    assert upload.file is not None
    refused = wait_batch(other, other.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    assert refused.status == "failed" and refused.errors and refused.errors.data
    assert refused.errors.data[0].code == "too_many_tasks" and refused.errors.data[0].line == BIG


# --------------------------------------------------------------------------- the S3 store


def test_shared_mode_on_s3_uploads_runs_and_cancels(upstream: Upstream, redis_server: RedisServer, s3: MotoS3,
                                                     tmp_path: Path) -> None:
    """Redis keeps the Upload records, S3 the parts: the SDK's chunked upload, a batch of it, a cancel."""
    config = gateway_config(upstream, models=("gpt-mini",))
    with start_shared(config, tmp_path / "data", redis_server.url, blobs=s3.location("uploads-e2e"),
                      env=s3.env()) as gw:
        client = gw.client(None)
        data = _lines(25, "s3")
        upload = client.uploads.upload_file_chunked(file=data, filename="s3.jsonl", bytes=len(data),
                                                    mime_type="application/jsonl", purpose="batch", part_size=900)
        assert upload.file is not None and client.files.content(upload.file.id).read() == data
        batch = client.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = wait_batch(client, batch.id)
        assert done.status == "completed" and [o["custom_id"] for o in read_jsonl(client, done.output_file_id)] \
            == [f"s3-{i}" for i in range(25)]
        other = client.uploads.create(bytes=10, filename="x.jsonl", mime_type="application/jsonl", purpose="batch")
        part = client.uploads.parts.create(other.id, data=b"0123456789")
        assert part.upload_id == other.id
        assert client.uploads.cancel(other.id).status == "cancelled"
        with pytest.raises(openai.ConflictError):
            client.uploads.complete(other.id, part_ids=[part.id])
        client.files.delete(upload.file.id)  # the File's deletion takes its parts from S3
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(upload.file.id)
        # parts of 5 MiB: S3 joins them into one object itself, and the parts go
        data = _lines(1, "s3big") + b"x" * (11 << 20)
        upload = client.uploads.upload_file_chunked(file=data, filename="big.bin", bytes=len(data),
                                                    mime_type="application/octet-stream", purpose="user_data",
                                                    part_size=5 << 20, md5=hashlib.md5(data).hexdigest())
        assert upload.file is not None and client.files.content(upload.file.id).read() == data
        keys = s3.keys(f"uploads-e2e/uploads/{upload.id}/")
        assert keys == [f"uploads-e2e/uploads/{upload.id}/file"], keys



async def test_s3_reads_a_completed_upload_as_its_parts(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    blobs = S3Blobs.from_url(s3.location("uploads"), endpoint_url=s3.url)
    try:
        parts = [(f"uploads/u1/p{i}", bytes([65 + i]) * (i + 1) * 1000) for i in range(3)]
        for key, data in parts:
            async with blobs.writing(key) as writer:
                await writer.write(data)
        manifest = "uploads/u1/file" + composed.SUFFIX
        async with blobs.writing(manifest) as writer:
            await writer.write(composed.manifest([(key, len(data)) for key, data in reversed(parts)]))
        got = b"".join([chunk async for chunk in blobs.read(manifest, 700)])
        assert got == b"".join(data for _, data in reversed(parts))
        assert await blobs.size(manifest) == 6000
        await blobs.delete(manifest)  # the file's deletion takes its parts
        for key, _ in parts:
            assert await blobs.size(key) is None
        assert await blobs.size(manifest) is None
    finally:
        await blobs.aclose()


async def test_s3_joins_parts_of_5_mib_by_its_own_multipart(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts S3's multipart takes (5 MiB each but the last) become one object by server-side part copies, in the
    order named; smaller ones stay a manifest of the parts. Either reads back as the parts in order."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    blobs = S3Blobs.from_url(s3.location("compose"), endpoint_url=s3.url)
    try:
        big = [(f"uploads/u2/p{i}", bytes([97 + i]) * size) for i, size in enumerate((5 << 20, 6 << 20, 1000))]
        for key, data in big:
            async with blobs.writing(key) as writer:
                await writer.write(data)
        order = [big[1], big[0], big[2]]  # the last part alone may be small
        key = await blobs.compose("uploads/u2/file", [(k, len(d)) for k, d in order])
        assert key == "uploads/u2/file" and not composed.is_composed(key)  # one plain object
        assert await blobs.size(key) == sum(len(d) for _, d in order)
        assert b"".join([c async for c in blobs.read(key, 1 << 20)]) == b"".join(d for _, d in order)
        for part, _ in big:  # the parts are untouched: the caller deletes them once the File is recorded
            assert await blobs.size(part) is not None
        small = [(k, len(d)) for k, d in (big[2], big[0])]  # a small part first: S3 refuses it as a part
        key = await blobs.compose("uploads/u2/other", small)
        assert composed.is_composed(key)
        assert b"".join([c async for c in blobs.read(key)]) == big[2][1] + big[0][1]
    finally:
        await blobs.aclose()


def test_the_manifest_lists_keys_in_order() -> None:
    assert json.loads(composed.manifest([("a", 1), ("b", 2)])) == {"parts": [{"key": "a", "bytes": 1},
                                                                            {"key": "b", "bytes": 2}]}
