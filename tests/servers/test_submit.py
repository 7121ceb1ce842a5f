"""`batchyard submit` against the real gateway, in both modes (the command as a subprocess, the openai SDK
inside it, the loopback upstream behind the gateway):

- end to end: it uploads, creates, follows and leaves the merged output in input order (failed lines inline,
  or in `--error-file`), exit status 0, progress lines on stderr when it is not a terminal;
- SIGKILLed mid-batch and run again: it goes on with the same batch (one file, one batch for the team), and
  the output holds every line once, in input order; with its state file lost too, the idempotency keys
  still find the same file and batch;
- `--detach` prints the batch id and returns; the same command without it follows that batch to the end;
- Ctrl-C: on a terminal it asks, and `y` cancels the batch and leaves what finished (exit status 130);
  without a terminal it leaves the batch running and says how to go on;
- a key the gateway refuses: exit status 2 and a message that names the key; none at all: the same.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, jsonl
from tests.support.team_helpers import MODEL, MODES, serve
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}]


# What the client alone decides (detach, a refused key, Ctrl-C) is the same against either mode: one is enough.
ONE_MODE = pytest.mark.parametrize("gateway", ["embedded"], indirect=True)


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # Small shards, one at a time: a batch of slow lines runs for seconds, its results arriving a few at a time.
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key="sk-admin", shard_size=4,
                            max_shards_in_flight=1)
    with serve(request.param, config, tmp_path_factory.mktemp(request.param) / "data") as server:
        yield server


def _input(path: Path, n: int, failing: set[int] = frozenset(), sleep_ms: int = 0) -> Path:  # type: ignore[assignment]
    tag = uuid.uuid4().hex[:8]
    path.write_bytes(jsonl(
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "messages": [{"role": "user", "content": f"#sleep:{sleep_ms} {tag} {i}"
                                                + (" #fail:400" if i in failing else "")}]}}
        for i in range(n)))
    return path


def _env(key: str | None = "sk-alpha") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, **({"OPENAI_API_KEY": key} if key else {})}


def _args(gw: Gateway, src: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", "submit", "-i", str(src), "-o", str(out), "--base-url",
            gw.url + "/v1", "--poll", "0.2", *more]


def _submit(gw: Gateway, src: Path, out: Path, *more: str, key: str | None = "sk-alpha"
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_args(gw, src, out, *more), cwd=REPO, env=_env(key), capture_output=True, text=True,
                          timeout=300)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _batches_named(gw: Gateway, name: str) -> list[str]:
    client = gw.client("sk-alpha")
    files = {f.id for f in client.files.list(purpose="batch") if f.filename == name}
    return [b.id for b in client.batches.list(limit=100).data if b.input_file_id in files]


@pytest.mark.parametrize("split", [False, True], ids=["errors-inline", "error-file"])
def test_submit_leaves_the_merged_output_in_input_order(gateway: Gateway, tmp_path: Path, split: bool) -> None:
    src, out, err = _input(tmp_path / f"e2e-{split}.jsonl", 10, failing={2, 7}), tmp_path / "out.jsonl", \
        tmp_path / "err.jsonl"
    proc = _submit(gateway, src, out, *(["--error-file", str(err)] if split else []))
    assert proc.returncode == 0, proc.stderr
    assert "completed: 10 requests, 8 succeeded, 2 failed" in proc.stderr and "Traceback" not in proc.stderr
    assert "/10 answered" in proc.stderr  # the progress, as plain lines: stderr is no terminal here
    rows = _rows(out)
    if split:
        assert [r["custom_id"] for r in rows] == [f"r{i}" for i in range(10) if i not in (2, 7)]
        assert [r["custom_id"] for r in _rows(err)] == ["r2", "r7"]
    else:
        assert [r["custom_id"] for r in rows] == [f"r{i}" for i in range(10)]
        assert [r["response"]["status_code"] for r in rows] == [200 if i not in (2, 7) else 400 for i in range(10)]
    assert len(_batches_named(gateway, src.name)) == 1
    assert not Path(f"{out}.batchyard-submit.json").exists()  # the state is gone once the output is whole


@pytest.mark.parametrize("lose_state", [False, True], ids=["state-kept", "state-lost"])
def test_submit_killed_and_run_again_finishes_the_same_batch(gateway: Gateway, tmp_path: Path,
                                                             lose_state: bool) -> None:
    src, out = _input(tmp_path / f"killed-{lose_state}.jsonl", 24, sleep_ms=150), tmp_path / "out.jsonl"
    first = subprocess.Popen(_args(gateway, src, out), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        # Results are written as they arrive: some are there while the batch still runs.
        eventually(lambda: out.exists() and out.read_text().count("\n") >= 4, what="the first results")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    batches = _batches_named(gateway, src.name)
    assert len(batches) == 1 and gateway.client("sk-alpha").batches.retrieve(batches[0]).status != "completed"
    if lose_state:
        Path(f"{out}.batchyard-submit.json").unlink()
    again = _submit(gateway, src, out)
    assert again.returncode == 0, again.stderr
    assert ("created" if lose_state else "resuming") in again.stderr and batches[0] in again.stderr
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(24)]
    assert _batches_named(gateway, src.name) == batches


@ONE_MODE
def test_detach_prints_the_batch_id_and_the_same_command_follows_it(gateway: Gateway, tmp_path: Path) -> None:
    src, out = _input(tmp_path / "detach.jsonl", 6), tmp_path / "out.jsonl"
    detached = _submit(gateway, src, out, "--detach")
    assert detached.returncode == 0, detached.stderr
    batch_id = detached.stdout.strip()
    assert batch_id.startswith("batch_") and _batches_named(gateway, src.name) == [batch_id]
    followed = _submit(gateway, src, out)
    assert followed.returncode == 0 and f"resuming batch {batch_id}" in followed.stderr
    assert [r["custom_id"] for r in _rows(out)] == [f"r{i}" for i in range(6)]
    assert _batches_named(gateway, src.name) == [batch_id]


@ONE_MODE
def test_a_key_the_gateway_refuses_is_a_usage_error(gateway: Gateway, tmp_path: Path) -> None:
    src, out = _input(tmp_path / "badkey.jsonl", 2), tmp_path / "out.jsonl"
    refused = _submit(gateway, src, out, key="sk-nobody")
    assert refused.returncode == 2 and "refused the key (401)" in refused.stderr
    assert "OPENAI_API_KEY" in refused.stderr and "Traceback" not in refused.stderr
    missing = _submit(gateway, src, out, key=None)
    assert missing.returncode == 2 and "OPENAI_API_KEY" in missing.stderr and "Traceback" not in missing.stderr
    assert not out.exists()


@ONE_MODE
def test_ctrl_c_without_a_terminal_leaves_the_batch_running(gateway: Gateway, tmp_path: Path) -> None:
    """No terminal to ask on: Ctrl-C leaves the batch running, says its id and how to go on, exit status 130."""
    src, out = _input(tmp_path / "ctrl-c.jsonl", 24, sleep_ms=150), tmp_path / "out.jsonl"
    proc = subprocess.Popen(_args(gateway, src, out), cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    eventually(lambda: Path(f"{out}.batchyard-submit.json").exists(), what="the batch created")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    [batch_id] = _batches_named(gateway, src.name)
    assert proc.returncode == 130 and f"left running: batch {batch_id}" in stderr and "Traceback" not in stderr
    assert gateway.client("sk-alpha").batches.retrieve(batch_id).status in ("validating", "in_progress")
    gateway.client("sk-alpha").batches.cancel(batch_id)  # not to hold the one shard slot for the next test


@ONE_MODE
def test_ctrl_c_on_a_terminal_asks_and_y_cancels_and_writes_what_finished(gateway: Gateway, tmp_path: Path) -> None:
    """On a terminal Ctrl-C asks whether to cancel; `y` cancels the batch, waits for it to end and leaves its
    output: every line once, those that never ran as `batch_cancelled` errors; exit status 130."""
    src, out = _input(tmp_path / "ctrl-c-y.jsonl", 24, sleep_ms=300), tmp_path / "out.jsonl"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(_args(gateway, src, out, "--no-progress"), cwd=REPO, env=_env(), stdin=follower,
                            stdout=follower, stderr=follower)
    os.close(follower)
    said = bytearray()

    def read_some() -> bytes:
        """What the command wrote to its terminal so far (an ended command's terminal reads as an error)."""
        while select.select([leader], [], [], 0.05)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            said.extend(chunk)
        return bytes(said)

    def ended() -> bool:
        read_some()  # keep the terminal drained: a full one would block the command
        return proc.poll() is not None

    try:
        eventually(lambda: b"created batch" in read_some(), what="the batch created")
        proc.send_signal(signal.SIGINT)
        eventually(lambda: b"[y/N]" in read_some(), what="the question")
        os.write(leader, b"y\n")
        eventually(ended, what="the command to end")
        read_some()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    text = said.decode(errors="replace")
    assert proc.returncode == 130, text
    assert "cancelling batch" in text and "cancelled" in text and "Traceback" not in text
    rows = _rows(out)
    assert [r["custom_id"] for r in rows] == [f"r{i}" for i in range(24)]
    assert any((r["error"] or {}).get("code") == "batch_cancelled" for r in rows)
