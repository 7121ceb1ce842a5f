"""Benchmark: one batch as big as its file (issue 51). A file of small chat lines, uploaded by the `openai` SDK's
`upload_file_chunked` in 64 MB parts to a real `batchyard serve`, then run as one batch on the loopback upstream
(tests/fakes/upstream/server.py); first a baseline batch of `--baseline-lines` through the same steps.

    .venv/bin/python bench/big_file.py                      # the issue's size: 4,000,000 lines, 2 GB
    .venv/bin/python bench/big_file.py --lines 200000       # a quick run (about 100 MB)

Flags: `--lines` (default 4,000,000) and `--line-bytes` (default 500: 2 GB at the default lines) size the big
file; `--baseline-lines` (default 20,000) the baseline batch; `--part-mb` the parts (default 64, OpenAI's most);
`--shard-size` and `--workers` the gateway's (defaults: the product's 1,000 lines, one worker process);
`--dir` where the files and the gateway's data go (default: a temporary directory, removed at the end; the big
run needs about 4x the file's size free there: the file, its upload, the output at about 1.7x); `--keep` leaves it.
`--plan-only` plans the big file in place, as a validation process does, and counts the shards' working blobs
it leaves under `batches/` (how many, their bytes, their disk blocks), with no gateway, upload or run.

Printed, for the baseline and the big batch:
- upload: wall and MB/s (the SDK's parts and `complete`, which streams the parts once for their md5);
- validation: wall from the batch's create until it leaves `validating`;
- run: wall until `completed`; the output's download; total wall;
- peak RSS of every gateway process (the API process, each worker, each validation process), sampled every
  50 ms, and the big batch's over the baseline's per role (aim: <= 1.2x);
- the disk high-water mark of the gateway's data directory (sampled every 0.5 s) against the input plus the
  output (aim: at most one shard's worth beside them), and the most beside them at any sample (the mark of
  the total alone would hide bytes beside that went before the output grew);
- the upload's MB/s against the aim (>= 100 MB/s on loopback).
The load average is printed at both ends. Not a test: figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from openai import OpenAI

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.server_helpers import Gateway, gateway_config, start_gateway  # noqa: E402

MB = 1_000_000
FINISHED = ("completed", "failed", "expired", "cancelled")


def _role(proc: psutil.Process, api_pid: int) -> str:
    if proc.pid == api_pid:
        return "api"
    line = " ".join(proc.cmdline())
    if "gateway.cli" in line and "worker" in line:
        return "worker"
    if "resource_tracker" in line:
        return "mp-tracker"
    if "multiprocessing" in line or "spawn_main" in line:
        return "validation"
    return proc.name()


class Sampler:
    """Peak RSS per gateway process (by role and pid) and the data directory's disk high-water mark."""

    def __init__(self, api_pid: int, data_dir: Path) -> None:
        self.api = psutil.Process(api_pid)
        self.data_dir = data_dir
        self.rss: dict[tuple[str, int], int] = {}
        self.disk = 0
        self.disk_parts: dict[str, int] = {}  # where the bytes were at the high-water mark
        # Beside the input (an Upload's parts) and the output (files): the most at any sample, wherever the
        # total's mark was (a copy of the input made and dropped while the output grew would hide under it).
        self.beside = 0
        self.beside_parts: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._memory, daemon=True),
                         threading.Thread(target=self._space, daemon=True)]

    def _memory(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                for proc in [self.api, *self.api.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        key = (_role(proc, self.api.pid), proc.pid)
                        self.rss[key] = max(self.rss.get(key, 0), proc.memory_info().rss)
            time.sleep(0.05)

    def _space(self) -> None:
        while not self._stop.is_set():
            parts = _disk_parts(self.data_dir)
            if sum(parts.values()) > self.disk:
                self.disk, self.disk_parts = sum(parts.values()), parts
            beside = {name: size for name, size in parts.items() if name not in _INPUT_AND_OUTPUT}
            if sum(beside.values()) > self.beside:
                self.beside, self.beside_parts = sum(beside.values()), beside
            time.sleep(0.5)

    def by_role(self) -> dict[str, int]:
        peaks: dict[str, int] = {}
        for (role, _), rss in self.rss.items():
            peaks[role] = max(peaks.get(role, 0), rss)
        return peaks

    def __enter__(self) -> Sampler:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


_INPUT_AND_OUTPUT = ("blobs/uploads", "blobs/files")  # the Upload's parts (the input), the merged output


def _disk_parts(root: Path) -> dict[str, int]:
    """Bytes on disk per part of the data directory: each folder under `blobs/` (files, uploads, batches,
    results), and each other entry (the SQLite store and its journal)."""
    parts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name == "blobs" and entry.is_dir():
                with contextlib.suppress(OSError):
                    for sub in os.scandir(entry.path):
                        parts[f"blobs/{sub.name}"] = _disk_bytes(Path(sub.path)) if sub.is_dir() else \
                            sub.stat().st_blocks * 512
            elif entry.is_dir():
                parts[entry.name] = _disk_bytes(Path(entry.path))
            else:
                with contextlib.suppress(OSError):
                    parts[entry.name] = entry.stat().st_blocks * 512
    return parts


def _disk_bytes(root: Path) -> int:
    """Bytes on disk under `root` (allocated blocks, so sparse or preallocated files count as they are)."""
    total = 0
    stack = [root]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def write_input(path: Path, lines: int, line_bytes: int, tag: str) -> int:
    """`lines` chat lines of about `line_bytes` each (the content padded), written as a stream."""
    with path.open("wb") as out:
        for i in range(lines):
            message = {"role": "user", "content": ""}
            head = {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "gpt-mini", "max_tokens": 1, "messages": [message]}}
            bare = len(json.dumps(head)) + 1
            message["content"] = f"{i} " + "x" * max(0, line_bytes - bare - len(str(i)) - 1)
            out.write(json.dumps(head).encode() + b"\n")
    return path.stat().st_size


def run_one(client: OpenAI, gw: Gateway, src: Path, lines: int, tag: str, part_bytes: int) -> dict[str, Any]:
    size = src.stat().st_size
    walls: dict[str, Any] = {"lines": lines, "bytes": size}
    with Sampler(gw.process.pid, gw.data_dir) as sampler:
        started = time.perf_counter()
        upload = client.uploads.upload_file_chunked(file=src, mime_type="application/jsonl", purpose="batch",
                                                    part_size=part_bytes)
        walls["upload"] = time.perf_counter() - started
        assert upload.file is not None, upload
        batch = client.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        created = time.perf_counter()
        while batch.status == "validating":
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        walls["validation"] = time.perf_counter() - created
        while batch.status not in FINISHED:
            time.sleep(1.0)
            batch = client.batches.retrieve(batch.id)
        walls["run"] = time.perf_counter() - created - walls["validation"]
        if batch.status != "completed" or batch.output_file_id is None:
            raise SystemExit(f"{tag}: batch {batch.id} {batch.status}: {batch.errors}")
        fetched = time.perf_counter()
        walls["output_bytes"], seen = _check_output(client, batch.output_file_id, tag, lines)
        walls["download"] = time.perf_counter() - fetched
        walls["total"] = time.perf_counter() - started
    walls["rss"] = sampler.by_role()
    walls["rss_each"] = dict(sampler.rss)
    walls["disk"] = sampler.disk
    walls["disk_parts"] = sampler.disk_parts
    walls["beside"], walls["beside_parts"] = sampler.beside, sampler.beside_parts
    if seen != lines:
        raise SystemExit(f"{tag}: {seen} output lines, expected {lines}")
    client.files.delete(batch.output_file_id)  # the next run's disk mark starts from the same floor
    client.files.delete(upload.file.id)
    return walls


def _check_output(client: OpenAI, file_id: str, tag: str, lines: int) -> tuple[int, int]:
    """The output's bytes and lines, read as a stream, each line's custom_id checked in input order."""
    size = seen = 0
    pending = b""
    with client.files.with_streaming_response.content(file_id) as reply:
        for chunk in reply.iter_bytes(1 << 20):
            size += len(chunk)
            pending += chunk
            *whole, pending = pending.split(b"\n")
            for raw in whole:
                if raw:
                    want = f'"custom_id": "{tag}-{seen}"'.encode()
                    if want not in raw and want.replace(b": ", b":") not in raw:
                        raise SystemExit(f"{tag}: output line {seen + 1} is not {tag}-{seen} (order or loss)")
                    seen += 1
    return size, seen


def _report(name: str, w: dict[str, Any]) -> None:
    mb = w["bytes"] / MB
    print(f"  {name}: {w['lines']:,} lines, {mb:,.1f} MB")
    print(f"    upload      {w['upload']:8.1f} s  {mb / w['upload']:7.1f} MB/s  (aim >= 100 MB/s)")
    print(f"    validation  {w['validation']:8.1f} s  {w['lines'] / max(w['validation'], 1e-9):,.0f} lines/s")
    print(f"    run         {w['run']:8.1f} s")
    print(f"    download    {w['download']:8.1f} s  ({w['output_bytes'] / MB:,.1f} MB of output)")
    print(f"    total       {w['total']:8.1f} s")
    for (role, pid), rss in sorted(w["rss_each"].items()):
        print(f"    peak RSS {role:11} pid {pid:<8} {rss / 2**20:8.0f} MiB")
    beside = w["disk"] - w["bytes"] - w["output_bytes"]
    print(f"    disk high-water {w['disk'] / MB:,.1f} MB: input {mb:,.1f} + output {w['output_bytes'] / MB:,.1f}"
          f" + {beside / MB:,.1f} MB beside them; at the mark: "
          + ", ".join(f"{name} {size / MB:,.1f}" for name, size in sorted(w["disk_parts"].items()) if size))
    print(f"    beside them at most {w['beside'] / MB:,.1f} MB at any time: "
          + ", ".join(f"{name} {size / MB:,.1f}" for name, size in sorted(w["beside_parts"].items()) if size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=4_000_000, help="lines of the big file (default 4,000,000)")
    parser.add_argument("--line-bytes", type=int, default=500, help="bytes per line, about (default 500)")
    parser.add_argument("--baseline-lines", type=int, default=20_000, help="lines of the baseline (default 20,000)")
    parser.add_argument("--part-mb", type=int, default=64, help="the SDK's part size in MiB (default 64)")
    parser.add_argument("--shard-size", type=int, default=1_000, help="the gateway's shard_size (default 1,000)")
    parser.add_argument("--workers", type=int, default=1, help="the gateway's worker processes (default 1)")
    parser.add_argument("--dir", type=Path, help="where the files and the gateway's data go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the files and the data directory")
    parser.add_argument("--plan-only", action="store_true",
                        help="only plan the big file in place (no gateway, no upload, no run) and count the shards' "
                             "working blobs it leaves: how many, their bytes and their disk blocks")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    root = Path(tempfile.mkdtemp(prefix="big-file-", dir=args.dir))
    try:
        _plan_only(args, root) if args.plan_only else _bench(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()}")


def _bench(args: argparse.Namespace, root: Path) -> None:
    small, big = root / "baseline.jsonl", root / "big.jsonl"
    written = time.perf_counter()
    write_input(small, args.baseline_lines, args.line_bytes, "s")
    write_input(big, args.lines, args.line_bytes, "b")
    print(f"  inputs written in {time.perf_counter() - written:.1f} s: {big.stat().st_size / MB:,.1f} MB")
    upload_limit = max(big.stat().st_size, 8 * 1024**3)
    with _gateway(args, root, upload_limit) as gw:
        client = OpenAI(base_url=gw.url + "/v1", api_key="sk-bench", max_retries=0, timeout=1800)
        part = args.part_mb * 1024 * 1024
        base = run_one(client, gw, small, args.baseline_lines, "s", part)
        _report("baseline", base)
        large = run_one(client, gw, big, args.lines, "b", part)
        _report("big", large)
    print("  big over baseline, peak RSS per role (aim <= 1.2x):")
    for role, rss in sorted(large["rss"].items()):
        was = base["rss"].get(role)
        ratio = f"{rss / was:5.2f}x" if was else "  (none in the baseline)"
        print(f"    {role:11} {rss / 2**20:8.0f} MiB against {was / 2**20 if was else 0:8.0f} MiB  {ratio}")
    per_line = args.shard_size / max(large["lines"], 1)
    beside = large["disk"] - large["bytes"] - large["output_bytes"]
    print(f"  disk beside input and output: {beside / MB:,.1f} MB at the mark, {large['beside'] / MB:,.1f} MB at "
          f"most at any time; one shard's output is about "
          f"{large['output_bytes'] * per_line / MB:,.2f} MB, its input {large['bytes'] * per_line / MB:,.2f} MB")


def _plan_only(args: argparse.Namespace, root: Path) -> None:
    """The planner alone over the big file, as a validation process runs it: what `batches/` holds after."""
    from gateway.config.schema import parse_config
    from gateway.pipeline.plan import PlanJob, plan_batch
    from gateway.store.blobs.directory import LocalBlobs
    from tests.support.services import shared_config

    src = root / "blobs" / "files" / "big"
    src.parent.mkdir(parents=True)
    write_input(src, args.lines, args.line_bytes, "b")
    config = parse_config(shared_config("http://127.0.0.1:9/v1", ("gpt-mini",), shard_size=args.shard_size,
                                        max_lines=max(args.lines, 50_000)))
    started = time.perf_counter()
    outcome = asyncio.run(plan_batch(config, LocalBlobs(root / "blobs"), PlanJob(
        "batch_plan", "files/big", endpoint=None, strict=True, allowed_models=None, max_lines=args.lines)))
    wall = time.perf_counter() - started
    kept = [p for p in (root / "blobs" / "batches").rglob("*") if p.is_file()]
    print(f"  planned {args.lines:,} lines ({src.stat().st_size / MB:,.1f} MB) in {wall:.1f} s: "
          f"{len(outcome.shards):,} shards{', FAILED' if outcome.failed else ''}")
    print(f"  the shards' working blobs: {len(kept):,}, {sum(p.stat().st_size for p in kept):,} bytes, "
          f"{sum(p.stat().st_blocks for p in kept) * 512:,} bytes on disk")


@contextlib.contextmanager
def _gateway(args: argparse.Namespace, root: Path, upload_limit: int) -> Iterator[Gateway]:
    with start_upstream() as upstream:
        config = gateway_config(upstream, models=("gpt-mini",), max_lines=max(args.lines, 50_000),
                                max_upload_bytes=upload_limit, shard_size=args.shard_size,
                                upload_expiry_seconds=7200)
        with start_gateway(config, root / "data", workers=args.workers, timeout=180) as gw:
            yield gw


if __name__ == "__main__":
    main()
