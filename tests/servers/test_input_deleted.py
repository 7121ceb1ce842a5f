"""An input file deleted while its batch runs: the batch runs every line, and the file's bytes go when it ends.

A running batch's shards read their lines in the input file itself (`gateway.pipeline.shard_input`), so the
delete that OpenAI allows may not take the bytes from under it: the file is 404 at once, its bytes stay while a
batch reads them, and the last batch reading them deletes them when it ends. Both an upload and a file made by
the Uploads API (its parts joined by a manifest), through a real `batchyard serve` and the `openai` SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, jsonl, start_gateway, wait_batch
from tests.support.waiting import eventually

KEY = "sk-deleted-alpha"
LINES = 8


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # one request at a time, two lines a shard: the later shards read their lines after the delete
    config = gateway_config(upstream, models=("gpt-mini",), teams=[{"team_id": "alpha", "api_keys": [KEY]}],
                            shard_size=2, max_concurrency=1)
    with start_gateway(config, tmp_path_factory.mktemp("deleted") / "data") as gateway:
        yield gateway


def _data(tag: str) -> bytes:
    return jsonl(chat_line(f"{tag}-{i}", "gpt-mini", f"{tag} {i} #sleep:300") for i in range(LINES))


def _upload(gw: Gateway, data: bytes, by_parts: bool) -> str:
    client = gw.client(KEY)
    if not by_parts:
        return client.files.create(file=("in.jsonl", data), purpose="batch").id
    upload = client.uploads.create(bytes=len(data), filename="in.jsonl", mime_type="application/jsonl",
                                   purpose="batch")
    cut = len(data) // 3 + 5  # mid-line
    parts = [client.uploads.parts.create(upload.id, data=piece).id for piece in (data[:cut], data[cut:])]
    done = client.uploads.complete(upload.id, part_ids=parts)
    assert done.file is not None
    return done.file.id


def _blobs(gw: Gateway) -> set[Path]:
    """The blobs on disk under the files and the Uploads' parts."""
    root = gw.data_dir / "blobs"
    return {p for folder in ("files", "uploads") for p in (root / folder).rglob("*") if p.is_file()}


@pytest.mark.parametrize("by_parts", [False, True], ids=["upload", "uploads-api"])
def test_a_batch_runs_all_its_lines_after_its_input_is_deleted(gw: Gateway, by_parts: bool) -> None:
    client = gw.client(KEY)
    data = _data("parts" if by_parts else "plain")
    before = _blobs(gw)
    file_id = _upload(gw, data, by_parts)
    kept = _blobs(gw) - before  # its bytes: its blob, or its manifest and parts
    assert len(kept) == (3 if by_parts else 1)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(client, batch.id, {"in_progress"}, timeout=30)
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    assert all(p.exists() for p in kept)  # the bytes stay while the batch reads them
    done = wait_batch(client, batch.id, timeout=60)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    assert done.output_file_id is not None
    out = client.files.content(done.output_file_id).text.splitlines()
    tag = "parts" if by_parts else "plain"
    assert [line.split('"custom_id":"')[1].split('"')[0] for line in out] == [f"{tag}-{i}" for i in range(LINES)]
    eventually(lambda: not any(p.exists() for p in kept), timeout=10)  # gone once the batch ended


def test_a_file_no_batch_reads_goes_at_once(gw: Gateway) -> None:
    client = gw.client(KEY)
    before = _blobs(gw)
    file_id = _upload(gw, _data("idle"), by_parts=False)
    kept = _blobs(gw) - before
    assert len(kept) == 1
    assert client.files.delete(file_id).deleted
    assert not any(p.exists() for p in kept)
