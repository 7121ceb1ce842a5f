"""The runtime's process model, embedded: worker processes, crashes, a poison shard, a resumable CLI.

Real processes throughout: `batchyard serve --workers N` over its data dir, the
loopback upstream, SIGKILL. Which worker holds which shard is read from the
embedded queue table (the SQLite file every process shares), as an operator
with `sqlite3` would.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import REPO_ROOT, Gateway, gateway_config, jsonl, start_gateway, wait_batch
from tests.support.waiting import eventually

MODEL = "gpt-mini"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(latency_ms=20) as server:
        yield server


def _lines(n: int, tag: str, sleep_ms: int = 0) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": [{"role": "user", "content": f"#count #sleep:{sleep_ms} {tag} {i}"}]}}
            for i in range(n)]


def _counted(upstream: Upstream, tag: str) -> Counter[str]:
    return Counter({k: v for k, v in upstream.stats()["by_custom"].items() if f" {tag} " in k})


def _config(upstream: Upstream, **batch: Any) -> dict[str, Any]:
    return gateway_config(upstream, models=(MODEL,), shard_size=20, max_concurrency=16, **batch)


def _holders(data_dir: Path) -> dict[str, int]:
    """shard key -> pid of the worker process holding it, from the embedded queue table."""
    db = sqlite3.connect(f"file:{data_dir / 'batchyard.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT key, consumer FROM queue WHERE consumer IS NOT NULL").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
    return {key: int(consumer.rpartition(":")[2]) for key, consumer in rows}


def _check_exactly_once(out: list[dict[str, Any]], lines: list[dict[str, Any]]) -> None:
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]  # once each, input order


def _output(gw: Gateway, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    client = gw.client(None)
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def _until(predicate: Any, timeout: float = 60, what: str = "") -> Any:
    return eventually(predicate, timeout, what or "a condition")


def test_shards_run_in_worker_processes_and_survive_a_sigkill(upstream: Upstream, tmp_path: Path) -> None:
    lines = _lines(300, "wkill", sleep_ms=30)
    with start_gateway(_config(upstream), tmp_path / "data", workers=2) as gw:
        client = gw.client(None)
        health = _until(lambda: (h := gw.http("GET", "/health").json()) and len(h["workers"]) == 2 and h,
                        what="two live workers")
        assert health["mode"] == "embedded"
        assert gw.process.pid not in {w["pid"] for w in health["workers"]}  # the API process runs no shard
        arrived_before = upstream.stats()["requests"]  # the upstream counts a request when it arrives
        file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        _until(lambda: (b := client.batches.retrieve(batch.id)).request_counts and b.request_counts.completed >= 40,
               what="40 results")
        victim = _until(lambda: next(iter(_holders(gw.data_dir).values()), None), what="a held shard")
        before = client.batches.retrieve(batch.id).request_counts
        assert before is not None
        os.kill(victim, signal.SIGKILL)
        # sent but not recorded by the kill: in flight, or answered and not yet journalled
        in_flight_at_kill = upstream.stats()["requests"] - arrived_before - before.completed
        done = wait_batch(client, batch.id, timeout=120)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (300, 0)
        out = _output(gw, done.output_file_id)
        _check_exactly_once(out, lines)
        assert all(o["response"]["status_code"] == 200 for o in out)
        counts = _counted(upstream, "wkill")
        assert len(counts) == 300
        assert sum(counts.values()) <= 300 + in_flight_at_kill
        # the killed worker was started again
        _until(lambda: len(gw.http("GET", "/health").json()["workers"]) == 2, what="the worker back")
        assert "exited with -9" in gw.log()


def test_api_process_killed_mid_batch_resumes_on_restart(upstream: Upstream, tmp_path: Path) -> None:
    lines = _lines(200, "apikill", sleep_ms=30)
    data_dir = tmp_path / "data"
    gw = start_gateway(_config(upstream), data_dir, workers=2)
    try:
        client = gw.client(None)
        file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        _until(lambda: (b := client.batches.retrieve(batch.id)).request_counts and b.request_counts.completed >= 30,
               what="30 results")
        workers = set(_holders(data_dir).values())
        gw.kill()
        # its worker processes notice their parent is gone and stop
        _until(lambda: not any(_alive(pid) for pid in workers), timeout=20, what="the workers to exit")
    finally:
        gw.kill()
    recorded = Counter(_counted(upstream, "apikill"))
    with start_gateway(_config(upstream), data_dir, workers=2, port=gw.port) as again:
        client = again.client(None)
        done = wait_batch(client, batch.id, timeout=120)
        assert done.status == "completed", done
        out = _output(again, done.output_file_id)
        _check_exactly_once(out, lines)
        assert all(o["response"]["status_code"] == 200 for o in out)
    counts = _counted(upstream, "apikill")
    assert len(counts) == 200
    resent = sum(counts.values()) - 200
    assert resent <= 2 * 16 + 64, (resent, sum(recorded.values()))  # in flight or not yet journalled at the kill


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead
        return stat.read().split()[2] != "Z"


def test_a_shard_that_kills_every_worker_is_given_up(upstream: Upstream, tmp_path: Path) -> None:
    """Lines 21-40 (shard 1) kill the worker that sends them: whenever one reaches the upstream, we SIGKILL
    the process holding shard 1. After 3 attempts the shard is given up: its lines get `shard_failed`
    errors, and the batch completes with the other shards' results."""
    # The poisoned lines are slow to answer, so the kill always comes before any of them is recorded.
    lines = _lines(20, "healthy") + _lines(20, "poisoned", sleep_ms=5000) + _lines(20, "healthy2")
    for i, line in enumerate(lines):
        line["custom_id"] = f"line-{i}"
    # One shard per worker at a time: a worker killed for shard 1 takes no healthy shard down with it
    # (a shard that shares a process with a poison one shares its fate, attempts included).
    with start_gateway(_config(upstream, max_shards_in_flight=1), tmp_path / "data", workers=2) as gw:
        client = gw.client(None)
        file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        poison = f"{batch.id}:1"
        kills, seen = 0, 0
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).status not in ("completed", "failed"):
            assert time.monotonic() < deadline
            arrived = sum(_counted(upstream, "poisoned").values())
            holder = _holders(gw.data_dir).get(poison)
            if arrived > seen and holder is not None and _alive(holder):
                os.kill(holder, signal.SIGKILL)
                kills, seen = kills + 1, arrived
            time.sleep(0.02)
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed"
        assert 3 <= kills <= 5, kills  # 3 attempts died (a late answer may fell one more before it sends)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (40, 20)
        out = _output(gw, done.output_file_id)
        errors = _output(gw, done.error_file_id)
        assert {e["custom_id"] for e in errors} == {f"line-{i}" for i in range(20, 40)}
        assert {e["error"]["code"] for e in errors} == {"shard_failed"}
        assert all(e["response"] is None for e in errors)
        assert sorted(o["custom_id"] for o in out + errors) == sorted(line["custom_id"] for line in lines)


# -- the CLI, resumable ---------------------------------------------------------------------------


def _run(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "run", *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.mark.parametrize("how", ["sigkill", "ctrl-c"])
def test_cli_resumes_from_its_data_dir(upstream: Upstream, tmp_path: Path, how: str) -> None:
    tag = f"resume{how[:4]}"
    lines = _lines(400, tag, sleep_ms=20)
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(lines))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(upstream)))
    out, data = tmp_path / "out.jsonl", tmp_path / "state"
    args = ["-i", str(source), "-o", str(out), "--config", str(config), "--data-dir", str(data), "--no-progress",
            "--workers", "0"]
    first = _run(args)
    _until(lambda: sum(_counted(upstream, tag).values()) >= 120, what="120 requests sent")
    first.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode != 0
    assert not out.exists()
    if how == "ctrl-c":
        assert b"the same command continues the run" in err, err
    sent_first = sum(_counted(upstream, tag).values())
    assert sent_first < 400
    second = _run(args)
    stdout, err = second.communicate(timeout=180)
    assert second.returncode == 0, err.decode()
    assert b"resuming batch" in err
    got = [json.loads(x) for x in out.read_text().splitlines()]
    _check_exactly_once(got, lines)
    assert all(o["response"]["status_code"] == 200 for o in got)
    counts = _counted(upstream, tag)
    assert len(counts) == 400
    # what finished before the interruption was not sent again: at most what was in flight or unjournalled
    assert sum(counts.values()) - 400 <= 16 + 64


def test_file_expiry_seconds_is_applied(upstream: Upstream, tmp_path: Path) -> None:
    """`batch_settings.file_expiry_seconds`: uploads without their own expiry get it, and are deleted after it."""
    with start_gateway(_config(upstream, file_expiry_seconds=2), tmp_path / "data", workers=0) as gw:
        client = gw.client(None)
        file = client.files.create(file=("in.jsonl", jsonl(_lines(1, "expiry"))), purpose="batch")
        assert file.expires_at == file.created_at + 2
        own = client.files.create(file=("own.jsonl", jsonl(_lines(1, "own"))), purpose="batch",
                                  expires_after={"anchor": "created_at", "seconds": 3600})
        assert own.expires_at == own.created_at + 3600  # the caller's own expiry wins
        _until(lambda: gw.http("GET", f"/v1/files/{file.id}").status_code == 404, timeout=20, what="the expiry")
        assert not list((gw.data_dir / "blobs" / "files").glob(f"{file.id}*"))  # its bytes went too
        assert client.files.retrieve(own.id).id == own.id
