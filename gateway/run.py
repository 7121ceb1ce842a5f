"""`batchyard run`: the server's pipeline, in-process, on an embedded store in a temp dir."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.console import log_path, say, stdout_bytes, terminal
from gateway.errors import ApiError
from gateway.pipeline import Pipeline, open_embedded
from gateway.records import BatchStatus
from gateway.routes import RouteKind
from gateway.store.base import BatchRecord
from gateway.store.local import LocalBlobs
from gateway.transfer import TransferError, deliver, is_url, read_source

EXIT_OK, EXIT_INPUT, EXIT_DELIVERY = 0, 1, 3
_MAX_ERRORS_SHOWN = 20
_BOM = b"\xef\xbb\xbf"


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
    """Start-up overlaps: the engines load while the input is read, stored and validated.

    Order: peek at the input (an empty file under run_batch's rules is done
    before any engine starts), start every local engine (side by side), upload
    and validate the input meanwhile, and start the shard workers once the
    engines are up. A bad input file fails without waiting for an engine; a bad
    engine fails before any request is sent and before any output exists.
    """
    started = time.monotonic()
    config = pipeline.config
    try:
        first, chunks = await _peek(read_source(opts.input))
    except (TransferError, OSError) as exc:
        say(str(exc))
        return EXIT_INPUT
    if first is None and config.run_batch_rules:
        return await _empty_run(pipeline, opts, started)  # run_batch: exit 0, empty output
    local = any(r.kind is RouteKind.LOCAL for r in config.routes.values())
    engines: asyncio.Task[None] | None = None
    if local:
        offline_for_local_models(config)
        engines = asyncio.create_task(pipeline.backends.start_local(), name="start-engines")
    try:
        batch = await _submit(pipeline, opts, _chain(first, chunks))
        if batch is None:
            return EXIT_INPUT
        engine_seconds = None
        if engines is not None:
            if not await _engines_or_invalid(pipeline, batch.id, engines):
                return _report_invalid(await _get(pipeline, batch.id))
            try:
                await engines
            except Exception as exc:
                say(f"the local engine could not start: {type(exc).__name__}: {exc}" + _see_log())
                return EXIT_INPUT
            engine_seconds = time.monotonic() - started
    finally:
        if engines is not None and not engines.done():
            engines.cancel()
    await pipeline.start(workers=True)
    try:
        batch = await _watch(pipeline, batch.id, opts.progress)
    except asyncio.CancelledError:
        # Ctrl-C: cancel the batch (upstream batch jobs included) before the pipeline closes.
        await asyncio.shield(_cancel(pipeline, batch.id))
        raise
    if batch.status is BatchStatus.FAILED:
        return _report_invalid(batch)
    code = await _deliver(pipeline, batch, opts)
    if opts.summary:
        _summarise(batch, time.monotonic() - started, engine_seconds)
    return code


async def _peek(chunks: AsyncIterator[bytes]) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """Read until the first non-blank byte: (everything read so far, the rest), or (None, ...) for a blank file."""
    seen = b""
    async for chunk in chunks:
        seen += chunk
        if seen.removeprefix(_BOM).strip():
            return seen, chunks
    return None, chunks


async def _chain(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


async def _submit(pipeline: Pipeline, opts: RunOptions, chunks: AsyncIterator[bytes]) -> BatchRecord | None:
    """Store the input and create the batch; validation and planning start in the background."""
    try:
        source = await pipeline.upload_file("", Path(opts.input).name or "input.jsonl", "batch", chunks)
    except (TransferError, OSError) as exc:
        say(str(exc))
        return None
    return await pipeline.create_batch(
        "", input_file_id=source.id, endpoint=None, completion_window=None, strict=False,
        split_errors=opts.error_file is not None, run_batch_errors=opts.run_batch_errors,
    )


async def _engines_or_invalid(pipeline: Pipeline, batch_id: str, engines: asyncio.Task[None]) -> bool:
    """Wait for the engines; False as soon as validation finds the file invalid (no need to wait then)."""
    while not engines.done():
        batch = await _get(pipeline, batch_id)
        if batch.status is BatchStatus.FAILED:
            return False
        await asyncio.wait({engines}, timeout=0.1)
    return True


async def _get(pipeline: Pipeline, batch_id: str) -> BatchRecord:
    batch = await pipeline.store.get_batch(batch_id)
    assert batch is not None
    return batch


async def _empty_run(pipeline: Pipeline, opts: RunOptions, started: float) -> int:
    """vLLM run_batch's answer to an empty file: an empty output (and error file), exit status 0."""
    assert isinstance(pipeline.blobs, LocalBlobs)
    local = pipeline.blobs.local_path("files/empty")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(b"")
    for dest in (opts.output, *([opts.error_file] if opts.error_file else [])):
        try:
            await _copy_out(local, dest)
        except (TransferError, OSError) as exc:
            say(str(exc))
            return EXIT_DELIVERY
    if opts.summary:
        say(f"0 requests in {time.monotonic() - started:.1f}s: the input file is empty" + _see_log())
    return EXIT_OK


def offline_for_local_models(config: Config) -> None:
    """No hub look-up when every local model (and tokenizer) is a directory: set HF_HUB_OFFLINE unless set."""
    paths: list[Any] = []
    for route in config.routes.values():
        if route.kind is RouteKind.LOCAL:
            args = route.engine_args
            paths += [args.get("model"), *([args["tokenizer"]] if args.get("tokenizer") else [])]
    if paths and all(isinstance(p, str | Path) and Path(str(p)).expanduser().is_dir() for p in paths):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _see_log() -> str:
    where = log_path()
    return f" (log: {where})" if where else ""


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

                bar = tqdm(total=batch.counts.total, unit="req", desc="batchyard", file=terminal(), disable=None)
            if bar is not None:
                bar.update(batch.counts.completed + batch.counts.failed - bar.n)
            if batch.status.finished:
                return batch
            await asyncio.sleep(0.2)
    finally:
        if bar is not None:
            bar.close()


def _report_invalid(batch: BatchRecord) -> int:
    out = terminal()
    say(f"the input file is invalid; nothing was sent ({len(batch.errors)} problem(s) listed):")
    for err in batch.errors[:_MAX_ERRORS_SHOWN]:
        where = f"line {err['line']}" if err.get("line") is not None else "file"
        print(f"  {where}: {err['code']}: {err['message']}", file=out)
    if len(batch.errors) > _MAX_ERRORS_SHOWN:
        print(f"  … and {len(batch.errors) - _MAX_ERRORS_SHOWN} more", file=out)
    return EXIT_INPUT


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
            await _copy_out(local, dest)
        except (TransferError, OSError) as exc:
            kept = Path.cwd() / f"batchyard-{batch.id}-{'errors' if dest == opts.error_file else 'output'}.jsonl"
            shutil.copyfile(local, kept)
            say(f"{exc}; the results are kept in {kept}")
            code = EXIT_DELIVERY
    return code


async def _copy_out(local: Path, dest: str) -> None:
    if dest == "-":  # the user's stdout (descriptor 1 may be the log file in quiet mode)
        out = stdout_bytes()
        with local.open("rb") as f:
            shutil.copyfileobj(f, out)
        out.flush()
        return
    await deliver(local, dest, on_retry=say)


def _summarise(batch: BatchRecord, seconds: float, engine_seconds: float | None) -> None:
    out = terminal()
    summary = batch.routes.get("summary") or {}
    total = batch.counts.total
    rate = total / seconds if seconds > 0 else 0.0
    say(
        f"{total} requests in {seconds:.1f}s ({rate:.0f} req/s): "
        f"{summary.get('succeeded', 0)} succeeded, {summary.get('failed', 0)} failed"
    )
    by_model: dict[str, dict[str, int]] = summary.get("by_model", {})
    statuses = sorted({s for counts in by_model.values() for s in counts})
    if by_model:
        width = max(len(m) for m in by_model) + 2
        print("  " + "model".ljust(width) + "".join(s.rjust(10) for s in statuses), file=out)
        for model, counts in sorted(by_model.items()):
            print("  " + model.ljust(width) + "".join(str(counts.get(s, "")).rjust(10) for s in statuses),
                  file=out)
    for name, route in sorted(batch.routes.items()):
        if isinstance(route, dict) and route.get("upstream_batch_ids"):
            cost = route.get("cost_usd")
            print(f"  {name}: native, upstream batches {', '.join(route['upstream_batch_ids'])}"
                  + (f", cost ${cost:.6f} at batch rates" if cost is not None else ""), file=out)
    if engine_seconds is not None:
        print(f"  local engines ready in {engine_seconds:.1f}s", file=out)
    usage = summary.get("usage", {})
    print(f"  tokens: input {usage.get('input_tokens', 0)}, output {usage.get('output_tokens', 0)}, "
          f"total {usage.get('total_tokens', 0)}", file=out)
    where = log_path()
    if where is not None:
        print(f"  log: {where}", file=out)


__all__ = ["ApiError", "RunOptions", "is_url", "run_batch_file"]
