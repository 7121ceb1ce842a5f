"""A team cannot fill what others need: per-team file storage quotas, and files that expire.

Real `batchyard serve` processes in both modes (embedded SQLite, and Redis with a worker), the OpenAI SDK
(or raw HTTP, where the body must stream slowly) as the client:
- a team's uploads count against its `max_file_storage_bytes` (its own, else `batch_settings`' default);
  an upload that would pass it is refused with 429 `storage_quota_exceeded`, and no byte of it is kept;
  deleting or expiring a file frees its bytes; two uploads racing for the last room cannot both pass;
- a file given no expiry gets `batch_settings.file_expiry_seconds` (30 days unless set), uploads and
  batch outputs alike, and once past it the sweep deletes its record and its bytes;
- a record written before expiry existed (no `expires_at`) still lists, downloads and deletes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.config.schema import parse_config
from gateway.errors import ConfigError
from gateway.store.redis.keys import Keys
from gateway.store.sqlite.files import SCHEMA as FILES_SCHEMA
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, jsonl, wait_batch
from tests.support.team_helpers import MODEL, MODES, lines, serve
from tests.support.waiting import eventually

KIB = 1024
QUOTA, DEFAULT_QUOTA = 1024 * KIB, 3 * 1024 * KIB
EXPIRY = 3  # batch_settings.file_expiry_seconds: short, to watch files expire
SMALL, ROOMY, ADMIN = "sk-small-0123456789", "sk-roomy-0123456789", "sk-admin"
TEAMS = [{"team_id": "small", "api_keys": [SMALL], "max_file_storage_bytes": QUOTA},
         {"team_id": "roomy", "api_keys": [ROOMY]}]  # batch_settings' default quota
KEEP = {"anchor": "created_at", "seconds": 3600}  # uploads that must outlive the tiny default expiry
OLD_ID = "file-0123456789abcdef0123456789abcdef"
OLD_BYTES = b'{"old": true}\n'


@pytest.fixture(scope="module", params=MODES)
def gw(request: pytest.FixtureRequest, upstream: Upstream,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key=ADMIN, file_expiry_seconds=EXPIRY,
                            max_file_storage_bytes=DEFAULT_QUOTA)
    data_dir = tmp_path_factory.mktemp(request.param) / "data"
    redis_url = request.getfixturevalue("redis_server").url if request.param == "shared" else None
    _write_old_record(data_dir, redis_url)
    with serve(request.param, config, data_dir, redis_url) as server:
        yield server


def _write_old_record(data_dir: Path, redis_url: str | None) -> None:
    """A file record as a version without file expiry wrote it: no `expires_at`, no storage entry."""
    record = {"id": OLD_ID, "owner": "roomy", "bytes": len(OLD_BYTES), "created_at": int(time.time()) - 86_400,
              "filename": "old.jsonl", "purpose": "batch", "blob_key": f"files/{OLD_ID}"}
    blob = data_dir / "blobs" / "files" / OLD_ID
    blob.parent.mkdir(parents=True)
    blob.write_bytes(OLD_BYTES)
    if redis_url is None:
        db = sqlite3.connect(data_dir / "batchyard.sqlite3")
        db.executescript(FILES_SCHEMA)
        db.execute("INSERT INTO files (id, owner, purpose, created_at, data) VALUES (?, ?, ?, ?, ?)",
                   (OLD_ID, "roomy", "batch", record["created_at"], json.dumps(record)))
        db.commit()
        db.close()
        return
    keys, client = Keys(), redis.Redis.from_url(redis_url)
    client.set(keys.file(OLD_ID), json.dumps(record))
    for index in (keys.files("roomy"), keys.files("roomy", "batch")):
        client.zadd(index, {OLD_ID: record["created_at"]})
    client.close()


def _upload(gw: Gateway, key: str, size: int, expires_after: dict[str, Any] | None = KEEP) -> Any:
    extra = {"expires_after": expires_after} if expires_after else {}
    return gw.client(key).files.create(file=("f.jsonl", _content(size)), purpose="batch", **extra)  # type: ignore[arg-type]


def _content(size: int) -> bytes:
    return b"x" * (size - 1) + b"\n"


def _refused(gw: Gateway, key: str, size: int) -> dict[str, Any]:
    with pytest.raises(openai.RateLimitError) as caught:
        _upload(gw, key, size)
    body = caught.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["code"], body["error"]["type"]) == ("storage_quota_exceeded", "rate_limit_error")
    return dict(body["error"])


def _blobs(gw: Gateway) -> set[str]:
    """Every name in the upload blob folder, temporary ones included."""
    return {p.name for p in (gw.data_dir / "blobs" / "files").iterdir()}


def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    eventually(check, timeout, "the sweep", interval=0.2)


def _clear(gw: Gateway, key: str) -> None:
    client = gw.client(key)
    for file in client.files.list().data:
        if file.id != OLD_ID:
            client.files.delete(file.id)


def test_uploads_fill_the_quota_exactly_then_are_refused_until_a_file_is_deleted(gw: Gateway) -> None:
    """Uploads up to the limit pass; the next is refused (429, its code, the limit and the use named) and
    leaves no bytes behind; deleting a file frees its bytes for the next upload."""
    files = [_upload(gw, SMALL, QUOTA // 4) for _ in range(4)]  # exactly the quota
    before = _blobs(gw)
    error = _refused(gw, SMALL, 1)
    assert f"Limit: {QUOTA} bytes ({QUOTA} bytes stored" in error["message"] and "'small'" in error["message"]
    assert _blobs(gw) <= before  # nothing of the refused upload was kept
    assert len(gw.client(SMALL).files.list().data) == 4
    gw.client(SMALL).files.delete(files[0].id)
    assert _upload(gw, SMALL, QUOTA // 4).bytes == QUOTA // 4
    _clear(gw, SMALL)


def test_an_upload_larger_than_the_room_is_refused_while_it_streams(gw: Gateway) -> None:
    """A file bigger than the whole quota is refused, its partial blob aborted; the team's use stays 0."""
    before = _blobs(gw)
    error = _refused(gw, SMALL, 2 * QUOTA)
    assert "(0 bytes stored" in error["message"]
    assert _blobs(gw) <= before
    assert _upload(gw, SMALL, QUOTA).bytes == QUOTA  # all of the room is still there
    _clear(gw, SMALL)


def test_a_file_sent_before_its_purpose_is_checked_the_same_way(gw: Gateway) -> None:
    """The `file` part before `purpose` (spooled until the fields are known): refused alike, nothing kept."""
    boundary = "file-first-boundary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f.jsonl"\r\n\r\n'.encode()
            + _content(QUOTA + 1)
            + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
              f"--{boundary}--\r\n".encode())
    before = _blobs(gw)
    reply = httpx.post(f"{gw.url}/v1/files", content=body, timeout=60,
                       headers={"Authorization": f"Bearer {SMALL}",
                                "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status_code == 429 and reply.json()["error"]["code"] == "storage_quota_exceeded"
    assert _blobs(gw) <= before and gw.client(SMALL).files.list().data == []


def test_one_team_at_its_quota_does_not_take_another_teams_room(gw: Gateway) -> None:
    """The quota is per team: `small` full leaves `roomy` its own (the default, batch_settings')."""
    _upload(gw, SMALL, QUOTA)
    _refused(gw, SMALL, 1)
    assert _upload(gw, ROOMY, 2 * QUOTA).bytes == 2 * QUOTA
    error = _refused(gw, ROOMY, 2 * QUOTA)  # 4 MiB > the default 3 MiB
    assert f"Limit: {DEFAULT_QUOTA} bytes" in error["message"]
    _clear(gw, SMALL)
    _clear(gw, ROOMY)


def _slow_upload(gw: Gateway, size: int, start: threading.Barrier, results: list[int]) -> None:
    """POST /files with a body that streams in 64 KiB chunks, 20 ms apart."""
    boundary = "storage-race-boundary"
    head = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n'
                   for n, v in (("purpose", "batch"), ("expires_after[anchor]", "created_at"),
                                ("expires_after[seconds]", "3600")))
    head += f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="r.jsonl"\r\n\r\n'
    content = _content(size)

    def body() -> Iterator[bytes]:
        yield head.encode()
        for i in range(0, size, 64 * KIB):
            yield content[i:i + 64 * KIB]
            time.sleep(0.02)
        yield f"\r\n--{boundary}--\r\n".encode()

    start.wait()
    reply = httpx.post(f"{gw.url}/v1/files", content=body(), timeout=60,
                       headers={"Authorization": f"Bearer {SMALL}",
                                "Content-Type": f"multipart/form-data; boundary={boundary}"})
    if reply.status_code == 429:
        assert reply.json()["error"]["code"] == "storage_quota_exceeded"
    results.append(reply.status_code)


def test_two_concurrent_uploads_that_together_pass_the_quota_cannot_both_pass(gw: Gateway) -> None:
    """Two uploads streaming at once, each fitting alone but not together: exactly one is refused, and
    only the other's bytes are kept."""
    before = _blobs(gw)
    start, results = threading.Barrier(2), []  # type: list[int]
    threads = [threading.Thread(target=_slow_upload, args=(gw, 640 * KIB, start, results)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == [200, 429]
    kept = gw.client(SMALL).files.list().data
    assert [f.bytes for f in kept] == [640 * KIB]
    assert _blobs(gw) - before == {kept[0].id}
    _clear(gw, SMALL)


def test_a_file_without_its_own_expiry_gets_the_default_and_is_deleted_after_it(gw: Gateway) -> None:
    """`expires_at` is `created_at` + `file_expiry_seconds`; once past, the sweep deletes the record (404)
    and the bytes, and the team's room comes back."""
    file = _upload(gw, SMALL, QUOTA, expires_after=None)
    assert file.expires_at == file.created_at + EXPIRY
    assert gw.client(SMALL).files.retrieve(file.id).expires_at == file.expires_at
    _refused(gw, SMALL, 1)
    _until(lambda: gw.http("GET", f"/v1/files/{file.id}", SMALL).status_code == 404)
    assert file.id not in _blobs(gw)
    assert file.id not in [f.id for f in gw.client(SMALL).files.list().data]
    assert _upload(gw, SMALL, QUOTA).bytes == QUOTA  # its bytes were freed with it
    _clear(gw, SMALL)


def test_a_batch_output_gets_the_default_expiry(gw: Gateway) -> None:
    """A batch created without `output_expires_after`: its output file expires `file_expiry_seconds` after
    it is written, and then goes like any other."""
    client = gw.client(ROOMY)
    source = client.files.create(file=("in.jsonl", jsonl(lines(2, "out", sleep_ms=0))), purpose="batch",
                                 expires_after=KEEP)  # type: ignore[arg-type]
    batch = wait_batch(client, client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    assert batch.status == "completed" and batch.output_file_id is not None
    output = client.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + EXPIRY
    _until(lambda: gw.http("GET", f"/v1/files/{output.id}", ROOMY).status_code == 404)
    _clear(gw, ROOMY)


def test_a_record_from_before_file_expiry_still_lists_downloads_and_deletes(gw: Gateway) -> None:
    """A record with no `expires_at` (written by an older version) keeps no expiry: it lists, reads and
    outlives the sweep; deleting it works as for any file."""
    client = gw.client(ROOMY)
    assert OLD_ID in [f.id for f in client.files.list().data]
    old = client.files.retrieve(OLD_ID)
    assert (old.expires_at, old.bytes) == (None, len(OLD_BYTES))
    assert "expires_at" not in gw.http("GET", f"/v1/files/{OLD_ID}", ROOMY).json()
    time.sleep(EXPIRY + 6)  # past a file sweep (every 5 s) that would delete an expired file
    assert client.files.content(OLD_ID).content == OLD_BYTES
    assert gw.http("GET", f"/v1/files/{OLD_ID}", SMALL).status_code == 404  # still only its owner's
    assert client.files.delete(OLD_ID).deleted
    assert gw.http("GET", f"/v1/files/{OLD_ID}", ROOMY).status_code == 404
    assert OLD_ID not in _blobs(gw)


@pytest.mark.parametrize(("settings", "key"), [
    ({"max_file_storage_bytes": 0}, "batch_settings.max_file_storage_bytes"),
    ({"teams": [{"team_id": "a", "max_file_storage_bytes": -1}]}, "batch_settings.teams[0].max_file_storage_bytes"),
    ({"teams": [{"team_id": "a", "max_file_storage_bytes": True}]}, "batch_settings.teams[0].max_file_storage_bytes"),
    ({"file_expiry_seconds": 0}, "batch_settings.file_expiry_seconds"),
])
def test_storage_settings_are_validated(settings: dict[str, Any], key: str) -> None:
    """A quota or expiry that is not a positive integer is refused at load, naming the key."""
    raw = {"model_list": [{"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "k"}}],
           "batch_settings": settings}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "team.yaml")
    assert caught.value.key == key


def test_the_defaults_are_30_day_expiry_and_no_storage_quota() -> None:
    """OpenAI's files expire after 30 days; `file_expiry_seconds: null` keeps them until deleted."""
    entry = {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "k"}}
    config = parse_config({"model_list": [entry]}, "team.yaml")
    assert (config.batch.file_expiry_seconds, config.batch.max_file_storage_bytes) == (30 * 86_400, None)
    never = parse_config({"model_list": [entry], "batch_settings": {"file_expiry_seconds": None}}, "team.yaml")
    assert never.batch.file_expiry_seconds is None
