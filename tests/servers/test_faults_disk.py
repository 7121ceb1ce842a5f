"""A disk that fills mid-batch pauses the batch; freeing it resumes it by itself, and nothing is lost.

The data directory of an embedded `serve` is a small tmpfs; once the batch is running, a ballast file fills it.
The rule: the shards that meet the full disk are handed back without spending an attempt, the runner pauses
(`batchyard_paused{reason="disk_full"}` is 1, `batchyard_machine_faults_total{kind="disk_full"}` counts, the
dashboard's card says "waiting: disk full since 10:02 UTC"), the API still answers `GET /v1/batches`, an upload
answers 503 `storage_unavailable` in OpenAI's shape (a Message Batch 529 `overloaded_error` in Anthropic's; no
traceback, the files already uploaded intact), and once
the ballast is deleted the batch completes on its own: every custom_id once, no line failed, no traceback in any
log. Before, a full disk spent the shards' attempts, filled the log with tracebacks and left the batch
`in_progress` for good.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.fault_checks import assert_every_line_once, assert_no_traceback, log_tail, logs, metric
from tests.support.server_helpers import chat_line, gateway_config, jsonl, start_gateway, submit, wait_batch
from tests.support.waiting import eventually

TMPFS_SIZE = "48m"


@contextlib.contextmanager
def small_filesystem(path: Path) -> Iterator[Path]:
    """A tmpfs mounted at `path`; the test is skipped where mounting is not permitted (not root, a container
    without CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the full-disk test cannot run here")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the full-disk test cannot run")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(ballast: Path) -> int:
    """Write zeros into `ballast` until the filesystem is full; returns the bytes written."""
    written = 0
    block = b"\0" * (1 << 20)
    with contextlib.suppress(OSError), ballast.open("wb", buffering=0) as out:
        while True:
            written += out.write(block)
    with contextlib.suppress(OSError), ballast.open("ab", buffering=0) as out:
        while True:  # the last few pages, a small block at a time
            written += out.write(block[:4096])
    return written


def test_a_full_disk_pauses_the_batch_and_freeing_it_resumes_it(upstream: Upstream, tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "data") as data:
        # one shard of ten lines at a time, 150 ms a line: the batch runs for a few seconds
        config = gateway_config(upstream, models=("gpt-mini",), shard_size=10, max_shards_in_flight=1)
        ids = [f"line-{i}" for i in range(300)]
        with start_gateway(config, data, workers=1) as gw:
            client = gw.client(None)
            kept = client.files.create(file=("kept.jsonl", jsonl([chat_line("k", "gpt-mini", "kept")])),
                                       purpose="batch")
            batch = submit(client, [chat_line(i, "gpt-mini", f"{i} #sleep:150") for i in ids])
            eventually(lambda: (client.batches.retrieve(batch.id).request_counts or batch).completed >= 30, 60,
                       "the batch under way")

            ballast = data / "ballast"
            fill(ballast)
            try:
                # The operator's view: the runner pauses for the disk, and says why.
                eventually(lambda: metric(gw, "batchyard_paused", reason="disk_full") == 1.0, 60,
                           "batchyard_paused{reason=disk_full}", detail=lambda: log_tail(gw))
                assert metric(gw, "batchyard_machine_faults_total", kind="disk_full") >= 1
                # …and the dashboard's card of the batch says what it waits for.
                eventually(lambda: "waiting: disk full since " in gw.http("GET", "/ui/api/batches").json()["cards"]
                           [batch.id], 60, "the dashboard's word")
                # The API answers: a list, the batch, and an upload refused in OpenAI's shape.
                assert gw.http("GET", "/v1/batches").status_code == 200
                assert client.batches.retrieve(batch.id).status == "in_progress"
                with pytest.raises(openai.APIStatusError) as refused:
                    client.files.create(file=("late.jsonl", jsonl([chat_line("x", "gpt-mini", "x" * 200_000)])),
                                        purpose="batch")
                assert refused.value.status_code == 503
                error = refused.value.response.json()["error"]
                assert (error["type"], error["code"]) == ("server_error", "storage_unavailable"), error
                assert "disk full" in error["message"]
                # The Message Batches door answers in Anthropic's shape: 529 overloaded_error, which its SDK retries.
                late = gw.http("POST", "/v1/messages/batches", json={"requests": [{"custom_id": "x", "params": {
                    "model": "gpt-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 200_000}]}}]})
                assert late.status_code == 529 and late.json()["error"]["type"] == "overloaded_error", late.text
                assert "disk full" in late.json()["error"]["message"]
            finally:
                ballast.unlink()

            wait_batch(client, batch.id, timeout=120)
            assert_every_line_once(client, batch.id, ids)
            assert metric(gw, "batchyard_paused", reason="disk_full") == 0.0
            assert client.files.content(kept.id).text.count("kept") == 1  # uploaded before the fault: intact
            text = logs(gw)
            assert "storage available again (disk full for" in text, log_tail(gw)
            assert "giving up" not in text and "failed; handing it back" not in text
            assert_no_traceback(gw)
