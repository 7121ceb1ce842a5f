"""`batchyard run`: the server's pipeline, in-process, on an embedded store in a temp dir."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.errors import ApiError
from gateway.pipeline import Pipeline, open_embedded
from gateway.records import BatchStatus
from gateway.routes import RouteKind
from gateway.store.base import BatchRecord
from gateway.store.local import LocalBlobs
from gateway.transfer import TransferError, deliver, is_url, read_source

EXIT_OK, EXIT_INPUT, EXIT_DELIVERY = 0, 1, 3
_MAX_ERRORS_SHOWN = 20


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


def _say(message: str) -> None:
    print(f"batchyard: {message}", file=sys.stderr, flush=True)


async def run_batch_file(config: Config, opts: RunOptions) -> int:
    tmp = None
    if opts.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="batchyard-", dir=opts.output_tmp_dir)
    data_dir = opts.data_dir or Path(tmp.name)  # type: ignore[union-attr]
    pipeline = await open_embedded(config, data_dir, recover_on_start=False)
    try:
        return await _run(pipeline, opts)
    finally:
        await pipeline.aclose()
        if tmp is not None:
            tmp.cleanup()


async def _run(pipeline: Pipeline, opts: RunOptions) -> int:
    started = time.monotonic()
    engine_seconds = None
    # Engines first: a bad model path fails here, before any request and before any output exists.
    if any(r.kind is RouteKind.LOCAL for r in pipeline.config.routes.values()):
        try:
            await pipeline.backends.start_local()
        except Exception as exc:
            _say(f"the local engine could not start: {type(exc).__name__}: {exc}")
            return EXIT_INPUT
        engine_seconds = time.monotonic() - started
    await pipeline.start(workers=True)
    try:
        source = await pipeline.upload_file("", Path(opts.input).name or "input.jsonl", "batch",
                                            read_source(opts.input))
    except (TransferError, OSError) as exc:
        _say(str(exc))
        return EXIT_INPUT
    batch = await pipeline.create_batch(
        "", input_file_id=source.id, endpoint=None, completion_window=None, strict=False,
        split_errors=opts.error_file is not None, run_batch_errors=opts.run_batch_errors,
    )
    try:
        batch = await _watch(pipeline, batch.id, opts.progress)
    except asyncio.CancelledError:
        # Ctrl-C: cancel the batch (upstream batch jobs included) before the pipeline closes.
        await asyncio.shield(_cancel(pipeline, batch.id))
        raise
    if batch.status is BatchStatus.FAILED:
        _report_invalid(batch)
        return EXIT_INPUT
    code = await _deliver(pipeline, batch, opts)
    if opts.summary:
        _summarise(batch, time.monotonic() - started, engine_seconds)
    return code


async def _cancel(pipeline: Pipeline, batch_id: str) -> None:
    with contextlib.suppress(Exception):
        await pipeline.cancel_batch(batch_id, "")
        async with asyncio.timeout(3.0):
            await pipeline.wait(batch_id)


async def _watch(pipeline: Pipeline, batch_id: str, progress: bool) -> BatchRecord:
    bar: Any = None
    try:
        while True:
            batch = await pipeline.store.get_batch(batch_id)
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


async def _deliver(pipeline: Pipeline, batch: BatchRecord, opts: RunOptions) -> int:
    blobs = pipeline.blobs
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
    for name, route in sorted(batch.routes.items()):
        if isinstance(route, dict) and route.get("upstream_batch_ids"):
            cost = route.get("cost_usd")
            print(f"  {name}: native, upstream batches {', '.join(route['upstream_batch_ids'])}"
                  + (f", cost ${cost:.6f} at batch rates" if cost is not None else ""), file=sys.stderr)
    if engine_seconds is not None:
        print(f"  local engines ready in {engine_seconds:.1f}s", file=sys.stderr)
    usage = summary.get("usage", {})
    print(f"  tokens: input {usage.get('input_tokens', 0)}, output {usage.get('output_tokens', 0)}, "
          f"total {usage.get('total_tokens', 0)}", file=sys.stderr)


__all__ = ["ApiError", "RunOptions", "is_url", "run_batch_file"]
