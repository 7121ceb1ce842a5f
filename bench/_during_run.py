"""bench/server_load.py --during-run: another team's `GET /v1/batches` while a big batch runs.

For each mode, a fresh `serve` (embedded with the product's default workers; shared: an API replica and one
`batchyard worker` over Redis) gets a `--run-lines`-line batch on the loopback upstream's route (it answers at
once), from team alpha. Once the batch has left `validating`, team beta's `GET /v1/batches` is timed for
`--run-seconds` while the batch runs; then the batch is cancelled. Prints p50/p99 per mode (aim: p99 <= 50 ms),
the lines done in the window, and the load average.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench._faults_setup import MODEL, Prober, batch, bench_config, deploy, percentiles
from tests.fakes.upstream.server import start_upstream


def _write(path: Path, lines: int) -> None:
    with path.open("w") as out:  # in pieces: the bench holds no big string
        for i in range(lines):
            out.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]}})
                      + "\n")


def _counts(url: str, batch_id: str) -> tuple[str, int]:
    b = batch(url, batch_id)
    counts = b.get("request_counts") or {}
    return str(b["status"]), int(counts.get("completed", 0)) + int(counts.get("failed", 0))


def during_run(lines: int, seconds: float) -> None:
    print(f"\nanother team's GET /v1/batches while a {lines:,}-line batch runs on an upstream route "
          f"(measured for {seconds:.0f} s after validation)", flush=True)
    with tempfile.TemporaryDirectory() as tmp, start_upstream() as upstream:
        source = Path(tmp) / "big.jsonl"
        _write(source, lines)
        config = bench_config(upstream, max_lines=max(1_000_000, lines),
                              max_file_bytes=source.stat().st_size + (10 << 20))
        for mode in ("embedded", "shared"):
            with deploy(mode, config, Path(tmp) / mode / "data", workers=None) as d:
                alpha = {"Authorization": "Bearer sk-alpha"}
                with Prober(d.url, every=0.01) as prober:
                    with source.open("rb") as f:
                        up = httpx.post(d.url + "/v1/files", headers=alpha, data={"purpose": "batch"},
                                        files={"file": ("big.jsonl", f)}, timeout=600)
                    up.raise_for_status()
                    created = httpx.post(d.url + "/v1/batches", headers=alpha, timeout=60, json={
                        "input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                        "completion_window": "24h"})
                    created.raise_for_status()
                    batch_id = created.json()["id"]
                    started = time.monotonic()
                    while _counts(d.url, batch_id)[0] == "validating":
                        time.sleep(0.2)
                    validated = time.monotonic() - started
                    prober.take()
                    window = time.monotonic()
                    # the measurement window: `seconds`, or until the batch finished (then it is measured no more)
                    while (now := time.monotonic()) - window < seconds and \
                            _counts(d.url, batch_id)[0] == "in_progress":
                        time.sleep(min(0.5, seconds - (now - window)))
                    latencies = prober.take()
                    measured = time.monotonic() - window
                    status, done = _counts(d.url, batch_id)
                    answered = dict(prober.statuses)
                if status in ("validating", "in_progress"):
                    httpx.post(f"{d.url}/v1/batches/{batch_id}/cancel", headers=alpha,
                               timeout=60).raise_for_status()
                deadline = time.monotonic() + 120
                while _counts(d.url, batch_id)[0] not in ("cancelled", "completed", "failed", "expired"):
                    if time.monotonic() > deadline:
                        print(f"  {mode}: the batch was not cancelled within 120 s")
                        break
                    time.sleep(0.5)
                p50, p99 = percentiles(latencies)
                workers = len(d.processes()) - 1
                print(f"  {mode:<8} p50 {p50:6.1f} ms   p99 {p99:6.1f} ms   ({len(latencies)} probes over "
                      f"{measured:.0f} s; aim p99 <= 50 ms)   validated in {validated:.0f} s, {done:,} lines done, "
                      f"{status} at the window's end, {workers} worker process(es), statuses {answered}, "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
