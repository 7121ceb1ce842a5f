"""`batchyard submit --chunked`: the file goes through the Uploads API in parts, against a real `batchyard
serve` (the command as a subprocess, the openai SDK inside it, the loopback upstream behind the gateway):

- end to end: one line per part on stderr, one File made of the parts, the batch's merged output in input
  order, no state file left;
- interrupted mid-upload (the team's storage quota crossed at the fourth part: a deterministic stop) and run
  again once there is room: the same Upload goes on with only the missing parts, and makes one File;
- SIGKILLed mid-upload and run again: the output is whole and in order, one batch of the input;
- a `complete` whose reply was lost: the rerun finds the File the Upload made, and makes no second one;
- `--part-size` past OpenAI's 64 MB: a usage error before anything is sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, jsonl, start_gateway
from tests.support.team_helpers import MODEL
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]

QUOTA = 1_000_000
PART = 1024
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"], "max_file_storage_bytes": QUOTA}]


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, shard_size=10)
    with start_gateway(config, tmp_path_factory.mktemp("chunked") / "data", workers=1) as server:
        yield server


def _input(path: Path, n: int, sleep_ms: int = 0) -> Path:
    tag = uuid.uuid4().hex[:8]
    path.write_bytes(jsonl(
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "messages": [{"role": "user", "content": f"#sleep:{sleep_ms} {tag} {i}"}]}}
        for i in range(n)))
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, "OPENAI_API_KEY": "sk-alpha"}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _args(gw: Gateway, src: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", "submit", "-i", str(src), "-o", str(out), "--base-url",
            gw.url + "/v1", "--poll", "0.2", "--chunked", "--part-size", f"{PART // 1024}K", *more]


def _submit(gw: Gateway, src: Path, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_args(gw, src, out, *more), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)


def _files_named(gw: Gateway, name: str) -> list[Any]:
    return [f for f in gw.client("sk-alpha").files.list(purpose="batch") if f.filename == name]


def _parts_said(stderr: str) -> list[int]:
    return [int(n) for n in re.findall(r"part (\d+)/\d+ sent: ", stderr)]


def _upload_state(out: Path) -> dict[str, Any]:
    return json.loads(Path(f"{out}.batchyard-upload.json").read_text())


def test_chunked_submit_sends_parts_and_leaves_the_merged_output(gateway: Gateway, tmp_path: Path) -> None:
    src, out = _input(tmp_path / "parts.jsonl", 30), tmp_path / "out.jsonl"
    parts = -(-src.stat().st_size // PART)
    done = _submit(gateway, src, out)
    assert done.returncode == 0, done.stderr
    assert _parts_said(done.stderr) == list(range(1, parts + 1)) and parts > 3  # a line per part, in order
    assert f"in {parts} part(s)" in done.stderr and "Traceback" not in done.stderr
    [made] = _files_named(gateway, src.name)
    assert made.bytes == src.stat().st_size
    assert gateway.client("sk-alpha").files.content(made.id).read() == src.read_bytes()
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(30)]
    assert not Path(f"{out}.batchyard-upload.json").exists() and not Path(f"{out}.batchyard-submit.json").exists()


def test_an_interrupted_upload_goes_on_with_the_missing_parts(gateway: Gateway, tmp_path: Path) -> None:
    """The quota leaves room for three parts: the fourth is refused, and the command stops with the three
    noted. With room made, the same command sends the rest to the same Upload."""
    client = gateway.client("sk-alpha")
    for old in client.files.list():  # this module's earlier files leave the quota to this test
        client.files.delete(old.id)
    filler = client.files.create(file=("filler.bin", b"y" * (QUOTA - 3 * PART - PART // 2)), purpose="batch")
    src, out = _input(tmp_path / "resumed.jsonl", 40), tmp_path / "out.jsonl"
    parts = -(-src.stat().st_size // PART)
    first = _submit(gateway, src, out)
    assert first.returncode == 1, first.stderr
    assert "storage_quota" in first.stderr or "429" in first.stderr
    assert "the same command sends the rest" in first.stderr and "Traceback" not in first.stderr
    assert _parts_said(first.stderr) == [1, 2, 3]
    state = _upload_state(out)
    assert len([p for p in state["part_ids"] if p]) == 3 and len(state["part_ids"]) == parts
    client.files.delete(filler.id)
    again = _submit(gateway, src, out)
    assert again.returncode == 0, again.stderr
    assert f"resuming upload {state['upload_id']}: 3 of {parts} parts already sent" in again.stderr
    assert _parts_said(again.stderr) == list(range(4, parts + 1))  # only the missing ones
    [made] = _files_named(gateway, src.name)
    assert client.files.content(made.id).read() == src.read_bytes()
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(40)]
    assert not Path(f"{out}.batchyard-upload.json").exists()


def test_killed_mid_upload_and_run_again(gateway: Gateway, tmp_path: Path) -> None:
    """SIGKILL once some parts are noted (a part may have been stored without being noted: it is sent again,
    and the copy not named is dropped at `complete`): the rerun ends with one File, one batch, every line."""
    src, out = _input(tmp_path / "killed.jsonl", 200), tmp_path / "out.jsonl"
    first = subprocess.Popen(_args(gateway, src, out), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: Path(f"{out}.batchyard-upload.json").exists()
                   and sum(1 for p in _upload_state(out)["part_ids"] if p) >= 2, what="two parts sent",
                   interval=0.01)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    again = _submit(gateway, src, out)
    assert again.returncode == 0, again.stderr
    assert "resuming upload" in again.stderr or "resuming batch" in again.stderr
    [made] = _files_named(gateway, src.name)
    assert gateway.client("sk-alpha").files.content(made.id).read() == src.read_bytes()
    batches = [b for b in gateway.client("sk-alpha").batches.list(limit=100).data if b.input_file_id == made.id]
    assert len(batches) == 1
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(200)]


def test_a_part_size_past_64m_is_a_usage_error(tmp_path: Path) -> None:
    src = _input(tmp_path / "x.jsonl", 1)
    refused = subprocess.run([sys.executable, "-m", "gateway.cli", "submit", "-i", str(src), "-o",
                              str(tmp_path / "o.jsonl"), "--base-url", "http://127.0.0.1:9/v1", "--part-size",
                              "65M"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "64M" in refused.stderr and "Traceback" not in refused.stderr


def test_a_complete_whose_reply_was_lost_finds_its_file(gateway: Gateway, tmp_path: Path) -> None:
    """Killed after the gateway completed the Upload but before the state noted its File: the rerun's
    `complete` is refused (`upload_already_completed`), and the File is found among the team's files."""
    src, out = _input(tmp_path / "lost-reply.jsonl", 8), tmp_path / "out.jsonl"
    data = src.read_bytes()
    client = gateway.client("sk-alpha")
    upload = client.uploads.create(bytes=len(data), filename=src.name, mime_type="application/jsonl",
                                   purpose="batch")
    ids = [client.uploads.parts.create(upload.id, data=data[i:i + PART]).id for i in range(0, len(data), PART)]
    made = client.uploads.complete(upload.id, part_ids=ids).file
    assert made is not None
    Path(f"{out}.batchyard-upload.json").write_text(json.dumps({
        "input_sha256": hashlib.sha256(data).hexdigest(), "upload_id": upload.id, "created_at": upload.created_at,
        "bytes": len(data), "part_size": PART, "part_ids": ids, "file_id": None}))
    done = _submit(gateway, src, out)
    assert done.returncode == 0, done.stderr
    assert f"uploaded {len(data) / 1e6:.1f} MB as {made.id}" in done.stderr and _parts_said(done.stderr) == []
    assert [f.id for f in _files_named(gateway, src.name)] == [made.id]  # no second File
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(8)]
