"""`batchyard run`: the server's runtime, in-process, on an embedded store in a temp dir.

With `--data-dir D` the state lives in D instead, and the run can be resumed:
the same command after a kill or Ctrl-C finds the batch of the same input and
options in D and continues it (finished requests are not sent again; each
custom_id is answered once). A file with many upstream requests also gets
worker processes over the same directory (one per extra core): the upstream
path is CPU-bound in LiteLLM, one core each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.records import BatchStatus
from gateway.routes import RouteKind
from gateway.runtime import Runtime, open_embedded
from gateway.store.base import BatchOptions, BatchRecord
from gateway.store.local import LocalBlobs
from gateway.store.sqlite_queue import SQLiteQueue
from gateway.transfer import TransferError, deliver, is_url, read_source
from gateway.worker_pool import WorkerPool

EXIT_OK, EXIT_INPUT, EXIT_DELIVERY = 0, 1, 3
_MAX_ERRORS_SHOWN = 20
# Upstream requests a file needs before worker processes pay for their start (a second or two each,
# mostly importing LiteLLM): at ~200 req/s on one core, 2,000 requests are ten seconds of work.
WORKER_MIN_REQUESTS = 2_000


@dataclass(slots=True)
class RunOptions:
    input: str
    output: str
    error_file: str | None = None
    data_dir: Path | None = None
    output_tmp_dir: Path | None = None
    progress: bool = True
    summary: bool = True
    run_batch_errors: bool = False
    config_path: str | None = None  # what worker processes load; None: no worker processes
    workers: int | None = None  # extra worker processes for upstream routes (None: one per extra core)
    verbose: bool = False


def _say(message: str) -> None:
    print(f"batchyard: {message}", file=sys.stderr, flush=True)


async def run_batch_file(config: Config, opts: RunOptions) -> int:
    tmp = None
    if opts.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="batchyard-", dir=opts.output_tmp_dir)
    data_dir = opts.data_dir or Path(tmp.name)  # type: ignore[union-attr]
    runtime = await open_embedded(config, data_dir)
    try:
        return await _run(runtime, data_dir, opts)
    finally:
        await runtime.aclose()
        if tmp is not None:
            tmp.cleanup()


def _options_key(opts: RunOptions) -> str:
    # A resumed run must have been started with the same options, or its output would differ.
    return f"split={opts.error_file is not None},run_batch={opts.run_batch_errors}"


async def _hashed(chunks: Any, digest: Any) -> Any:
    async for chunk in chunks:
        digest.update(chunk)
        yield chunk


async def _previous(runtime: Runtime, input_sha256: str, key: str) -> BatchRecord | None:
    """The batch an earlier run in this data dir made from the same input with the same options."""
    after = None
    while True:
        page = await runtime.store.list_batches("", limit=100, after=after)
        for batch in page.data:
            meta = batch.metadata or {}
            if meta.get("input_sha256") == input_sha256 and meta.get("run_options") == key \
                    and batch.status is not BatchStatus.FAILED:
                return batch
        if not page.has_more or not page.data:
            return None
        after = page.data[-1].id


async def _run(runtime: Runtime, data_dir: Path, opts: RunOptions) -> int:
    started = time.monotonic()
    engine_seconds = None
    # Engines first: a bad model path fails here, before any request and before any output exists.
    if any(r.kind is RouteKind.LOCAL for r in runtime.config.routes.values()):
        try:
            await runtime.backends.start_local()
        except Exception as exc:
            _say(f"the local engine could not start: {type(exc).__name__}: {exc}")
            return EXIT_INPUT
        engine_seconds = time.monotonic() - started
    await runtime.start()
    digest = hashlib.sha256()
    try:
        source = await runtime.service.upload_file("", Path(opts.input).name or "input.jsonl", "batch",
                                                   _hashed(read_source(opts.input), digest))
    except (TransferError, OSError) as exc:
        _say(str(exc))
        return EXIT_INPUT
    key = _options_key(opts)
    batch = await _previous(runtime, digest.hexdigest(), key) if opts.data_dir is not None else None
    if batch is not None:
        await runtime.service.delete_file(source.id, None)
        done = batch.counts.completed + batch.counts.failed
        _say(f"resuming batch {batch.id} from {opts.data_dir}: {done} of {batch.counts.total} requests already "
             "answered")
    else:
        batch = await runtime.service.create_batch(
            "", input_file_id=source.id, endpoint=None, completion_window=None,
            metadata={"input_sha256": digest.hexdigest(), "run_options": key},
            options=BatchOptions(strict=False, split_errors=opts.error_file is not None,
                                 run_batch_errors=opts.run_batch_errors),
        )
    pool = None
    try:
        pool = await _start_workers(runtime, data_dir, batch.id, opts)
        batch = await _watch(runtime, batch.id, opts.progress)
    except asyncio.CancelledError:
        if opts.data_dir is None:
            # Ctrl-C with nothing to resume from: cancel the batch (upstream batch jobs included).
            await asyncio.shield(_cancel(runtime, batch.id))
        else:
            _say(f"interrupted; the state is kept in {opts.data_dir}: the same command continues the run")
        raise
    finally:
        if pool is not None:
            await pool.aclose()
    if batch.status is BatchStatus.FAILED:
        _report_invalid(batch)
        return EXIT_INPUT
    code = await _deliver(runtime, batch, opts)
    if opts.summary:
        _summarise(batch, time.monotonic() - started, engine_seconds)
    return code


async def _start_workers(runtime: Runtime, data_dir: Path, batch_id: str, opts: RunOptions) -> WorkerPool | None:
    """Worker processes for the upstream routes, when the file has enough upstream requests to pay for them."""
    count = opts.workers if opts.workers is not None else (os.cpu_count() or 1) - 1
    if count <= 0 or opts.config_path is None:
        return None
    upstream = {r.model_name for r in runtime.config.routes.values() if r.kind is not RouteKind.LOCAL}
    if not upstream:
        return None
    batch = await runtime.service.wait_validated(batch_id)
    if batch.status is not BatchStatus.IN_PROGRESS:
        return None
    shards = await runtime.store.unfinished_shards(batch_id)
    if sum(s.size for s in shards if s.route in upstream) < WORKER_MIN_REQUESTS:
        return None
    assert isinstance(runtime.queue, SQLiteQueue)
    pool = WorkerPool(count, data_dir, runtime.queue, config_path=opts.config_path, upstream_only=True,
                      verbose=opts.verbose)
    await pool.start()
    return pool


async def _cancel(runtime: Runtime, batch_id: str) -> None:
    with contextlib.suppress(Exception):
        await runtime.service.cancel_batch(batch_id, "")
        async with asyncio.timeout(3.0):
            await runtime.service.wait(batch_id)


async def _watch(runtime: Runtime, batch_id: str, progress: bool) -> BatchRecord:
    bar: Any = None
    try:
        while True:
            batch = await runtime.store.get_batch(batch_id)
            assert batch is not None
            if progress and bar is None and batch.counts.total:
                from tqdm import tqdm

                bar = tqdm(total=batch.counts.total, unit="req", desc="batchyard", file=sys.stderr, disable=None)
            if bar is not None:
                bar.update(batch.counts.completed + batch.counts.failed - bar.n)
            if batch.status.finished:
                return batch
            await asyncio.sleep(0.2)
    finally:
        if bar is not None:
            bar.close()


def _report_invalid(batch: BatchRecord) -> None:
    _say(f"the input file is invalid; nothing was sent ({len(batch.errors)} problem(s) listed):")
    for err in batch.errors[:_MAX_ERRORS_SHOWN]:
        where = f"line {err['line']}" if err.get("line") is not None else "file"
        print(f"  {where}: {err['code']}: {err['message']}", file=sys.stderr)
    if len(batch.errors) > _MAX_ERRORS_SHOWN:
        print(f"  … and {len(batch.errors) - _MAX_ERRORS_SHOWN} more", file=sys.stderr)


async def _deliver(runtime: Runtime, batch: BatchRecord, opts: RunOptions) -> int:
    blobs = runtime.blobs
    assert isinstance(blobs, LocalBlobs)
    pairs = [(batch.output_file_id, opts.output)]
    if opts.error_file is not None:
        pairs.append((batch.error_file_id, opts.error_file))
    code = EXIT_OK
    for file_id, dest in pairs:
        if file_id is None:
            local = blobs.local_path(f"files/empty-{batch.id}")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(b"")
        else:
            local = blobs.local_path(f"files/{file_id}")
        try:
            await deliver(local, dest, on_retry=_say)
        except (TransferError, OSError) as exc:
            kept = Path.cwd() / f"batchyard-{batch.id}-{'errors' if dest == opts.error_file else 'output'}.jsonl"
            shutil.copyfile(local, kept)
            _say(f"{exc}; the results are kept in {kept}")
            code = EXIT_DELIVERY
    return code


def _summarise(batch: BatchRecord, seconds: float, engine_seconds: float | None) -> None:
    summary = batch.routes.get("summary") or {}
    total = batch.counts.total
    rate = total / seconds if seconds > 0 else 0.0
    _say(
        f"{total} requests in {seconds:.1f}s ({rate:.0f} req/s): "
        f"{summary.get('succeeded', 0)} succeeded, {summary.get('failed', 0)} failed"
    )
    by_model: dict[str, dict[str, int]] = summary.get("by_model", {})
    statuses = sorted({s for counts in by_model.values() for s in counts})
    if by_model:
        width = max(len(m) for m in by_model) + 2
        widths = [max(10, len(s) + 2) for s in statuses]  # codes like upstream_unreachable are long
        print("  " + "model".ljust(width) + "".join(s.rjust(w) for s, w in zip(statuses, widths, strict=True)),
              file=sys.stderr)
        for model, counts in sorted(by_model.items()):
            cells = "".join(str(counts.get(s, "")).rjust(w) for s, w in zip(statuses, widths, strict=True))
            print("  " + model.ljust(width) + cells, file=sys.stderr)
    priced = {n: r for n, r in batch.routes.items() if n != "summary" and isinstance(r, dict) and "requests" in r}
    if priced:
        width = max(len(m) for m in priced) + 2
        print("  " + "route".ljust(width) + "requests".rjust(10) + "tokens in".rjust(12) + "tokens out".rjust(12)
              + "cost USD".rjust(12), file=sys.stderr)
        for name, r in sorted(priced.items()):
            cost = f"{r['cost_usd']:.6f}" if r.get("cost_usd") else "-"
            print("  " + name.ljust(width) + str(r["requests"]).rjust(10) + str(r["input_tokens"]).rjust(12)
                  + str(r["output_tokens"]).rjust(12) + cost.rjust(12), file=sys.stderr)
    for name, route in sorted(batch.routes.items()):
        if isinstance(route, dict) and route.get("upstream_batch_ids"):
            native_cost = route.get("cost_usd")
            print(f"  {name}: native, upstream batches {', '.join(route['upstream_batch_ids'])}"
                  + (f", cost ${native_cost:.6f} at batch rates" if native_cost is not None else ""),
                  file=sys.stderr)
    if engine_seconds is not None:
        print(f"  local engines ready in {engine_seconds:.1f}s", file=sys.stderr)
    usage = summary.get("usage", {})
    print(f"  tokens: input {usage.get('input_tokens', 0)}, output {usage.get('output_tokens', 0)}, "
          f"total {usage.get('total_tokens', 0)}", file=sys.stderr)


__all__ = ["WORKER_MIN_REQUESTS", "RunOptions", "is_url", "run_batch_file"]
