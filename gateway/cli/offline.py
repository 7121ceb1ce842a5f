"""`batchyard run`: the server's runtime, in-process, on an embedded store in a temp dir.

With `--data-dir D` the state lives in D instead, and the run can be resumed:
the same command after a kill or Ctrl-C finds the batch of the same input and
options in D and continues it (finished requests are not sent again; each
custom_id is answered once). `--workers N` adds N worker processes over the
same directory for the upstream routes: LiteLLM's per-call work is CPU-bound,
one core each, so they pay where cores are free (not beside a loopback
upstream on two cores, where they cost more than they bring).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.cli.console import log_path, say, stdout_bytes, terminal
from gateway.cli.report import report_invalid, summarise
from gateway.cli.transfer import Reader, TransferError, deliver, is_url, read_source, source_name
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.domain import BatchStatus
from gateway.estimate.cost import estimate_lines
from gateway.pipeline.validate import LINE_SLACK
from gateway.runtime.runtime import Runtime, open_embedded
from gateway.runtime.supervisor import Supervisor, default_workers
from gateway.store.blobs.keys import file_key
from gateway.store.records import BatchOptions, BatchRecord
from gateway.store.splitter import prepended, split_lines

EXIT_OK, EXIT_INPUT, EXIT_DELIVERY = 0, 1, 3
_BOM = b"\xef\xbb\xbf"
# Upstream requests a file needs before worker processes pay for their start (a second or two of CPU each,
# mostly importing LiteLLM): at ~150 req/s on one core, 2,000 requests are some fifteen seconds of work.
WORKER_MIN_REQUESTS = 2_000
_CHUNK = 1 << 20  # delivering the output: read from the blob store in MiB pieces


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
    workers: int | None = None  # extra worker processes for upstream routes; None: one per free core
    verbose: bool = False
    # Called once when start-up is over (engines ready, input stored), before any request runs: the command
    # freezes the start-up heap there (`gateway.cli.heap`).
    on_started: Callable[[], None] | None = None
    output_reruns: int | None = None  # `--output-reruns`; None: the config's `output_check`
    dry_run: bool = False  # print the cost estimate and the errors; send nothing, start no engine, write nothing


async def run_batch_file(config: Config, opts: RunOptions) -> int:
    config = dataclasses.replace(config, batch=config.batch.for_own_file())  # the caller's own file, any size
    if opts.dry_run:
        return await dry_run(config, opts)
    tmp = None
    if opts.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="batchyard-", dir=opts.output_tmp_dir)
    data_dir = opts.data_dir or Path(tmp.name)  # type: ignore[union-attr]
    runtime = await open_embedded(config, data_dir)
    try:
        return await _run(runtime, opts)
    finally:
        await runtime.aclose()
        if tmp is not None:
            tmp.cleanup()


async def _run(runtime: Runtime, opts: RunOptions) -> int:
    """Start-up overlaps: the engines load while the input is read, stored and validated.

    Order: peek at the input (an empty file under run_batch's rules is done
    before any engine starts), start every local engine (side by side), upload
    and validate the input meanwhile, and start running shards once the engines
    are up. A bad input file fails without waiting for an engine; a bad engine
    fails before any request is sent and before any output exists.
    """
    started = time.monotonic()
    config = runtime.config
    try:
        first, chunks = await _peek(read_source(opts.input))
    except (TransferError, OSError) as exc:
        say(str(exc))
        return EXIT_INPUT
    if first is None and config.run_batch_rules:
        return await _empty_run(runtime, opts, started)  # run_batch: exit 0, empty output
    engines: asyncio.Task[None] | None = None
    if any(r.kind is RouteKind.LOCAL for r in config.routes.values()):
        offline_for_local_models(config)
        engines = asyncio.create_task(runtime.backends.start_local(), name="start-engines")
    engine_seconds = None
    try:
        batch = await _submit(runtime, opts, prepended(first, chunks))
        if batch is None:
            return EXIT_INPUT
        if engines is not None:
            if not await _engines_or_invalid(runtime, batch.id, engines):
                report_invalid(await _get(runtime, batch.id))
                return EXIT_INPUT
            try:
                await engines
            except Exception as exc:
                say(f"the local engine could not start: {type(exc).__name__}: {exc}" + _see_log())
                return EXIT_INPUT
            engine_seconds = time.monotonic() - started
    finally:
        if engines is not None and not engines.done():
            engines.cancel()
    await runtime.start()  # LiteLLM imported and every backend started: start-up's heap is all there
    if opts.on_started is not None:  # before the first request (nothing has run since start returned)
        opts.on_started()
    pool = None
    try:
        pool = await _start_workers(runtime, batch.id, opts)
        batch = await watch_run(runtime, batch.id, opts.progress)
    except asyncio.CancelledError:
        if opts.data_dir is None:
            # Ctrl-C with nothing to resume from: cancel the batch (upstream batch jobs included).
            await asyncio.shield(_cancel(runtime, batch.id))
        else:
            say(f"interrupted; the state is kept in {opts.data_dir}: the same command continues the run")
        raise
    finally:
        if pool is not None:
            await pool.aclose()
    if batch.status is BatchStatus.FAILED:
        report_invalid(batch)
        return EXIT_INPUT
    code = await deliver_run(runtime, batch, opts)
    if opts.summary:
        summarise(batch, time.monotonic() - started, engine_seconds)
    return code


async def dry_run(config: Config, opts: RunOptions) -> int:
    """`--dry-run`: the file's cost estimate as a table on stdout, read straight from the input (no store, no
    engine, no request); exit status 1 when the run would fail on the file's errors."""
    offline_for_local_models(config)  # a local model's tokenizer is read from its directory, never fetched
    cap = config.batch.limits.max_line_bytes + LINE_SLACK
    try:
        # the run's own rules: a line that can't run is answered in place, not a failure
        estimate = await estimate_lines(config, split_lines(read_source(opts.input), cap), strict=False)
    except (TransferError, OSError) as exc:
        say(str(exc))
        return EXIT_INPUT
    out = stdout_bytes()
    out.write(estimate.table().encode())
    out.flush()
    return EXIT_INPUT if estimate.error_count else EXIT_OK


async def _peek(chunks: AsyncIterator[bytes]) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """Read until the first non-blank byte: (everything read so far, the rest), or (None, ...) for a blank file."""
    seen = b""
    async for chunk in chunks:
        seen += chunk
        if seen.removeprefix(_BOM).strip():
            return seen, chunks
    return None, chunks


async def _hashed(chunks: AsyncIterator[bytes], digest: Any) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        digest.update(chunk)
        yield chunk


def options_key(opts: RunOptions) -> str:
    # A resumed run must have been started with the same options, or its output would differ.
    return f"split={opts.error_file is not None},run_batch={opts.run_batch_errors}"


async def _submit(runtime: Runtime, opts: RunOptions, chunks: AsyncIterator[bytes]) -> BatchRecord | None:
    """Store the input and create its batch (validation starts in the background), or find the batch an
    earlier run in `--data-dir` made of the same input with the same options, and continue that."""
    digest = hashlib.sha256()
    try:
        source = await runtime.service.upload_file("", source_name(opts.input), "batch",
                                                   _hashed(chunks, digest))
    except (TransferError, OSError) as exc:
        say(str(exc))
        return None
    key = options_key(opts)
    if opts.data_dir is not None and (batch := await previous_run(runtime, digest.hexdigest(), key)) is not None:
        await runtime.service.delete_file(source.id, None)
        done = batch.counts.completed + batch.counts.failed
        say(f"resuming batch {batch.id} from {opts.data_dir}: {done} of {batch.counts.total} requests already "
            "answered")
        return batch
    return await runtime.service.create_batch(
        "", input_file_id=source.id, endpoint=None, completion_window=None,
        metadata={"input_sha256": digest.hexdigest(), "run_options": key},
        options=BatchOptions(strict=False, split_errors=opts.error_file is not None,
                             run_batch_errors=opts.run_batch_errors, output_reruns=opts.output_reruns),
    )


async def previous_run(runtime: Runtime, input_sha256: str, key: str) -> BatchRecord | None:
    after = None
    while True:
        page = await runtime.store.batches.page("", limit=100, after=after)
        for batch in page.data:
            meta = batch.metadata or {}
            # A `--retry-failed` batch carries the run's metadata too, and `retry_of`: the run is the other one.
            if (meta.get("input_sha256"), meta.get("run_options")) == (input_sha256, key) \
                    and batch.status is not BatchStatus.FAILED and "retry_of" not in meta:
                return batch
        if not page.has_more or not page.data:
            return None
        after = page.data[-1].id


async def _engines_or_invalid(runtime: Runtime, batch_id: str, engines: asyncio.Task[None]) -> bool:
    """Wait for the engines; False as soon as validation finds the file invalid (no need to wait then)."""
    while not engines.done():
        batch = await _get(runtime, batch_id)
        if batch.status is BatchStatus.FAILED:
            return False
        await asyncio.wait({engines}, timeout=0.1)
    return True


async def _get(runtime: Runtime, batch_id: str) -> BatchRecord:
    batch = await runtime.store.batches.get(batch_id)
    assert batch is not None
    return batch


async def _start_workers(runtime: Runtime, batch_id: str, opts: RunOptions) -> Supervisor | None:
    """Worker processes for the upstream routes, when the file has enough upstream requests to pay for them."""
    count = opts.workers if opts.workers is not None else default_workers(runtime.config, serving=False)
    upstream = {r.model_name for r in runtime.config.routes.values() if r.kind is not RouteKind.LOCAL}
    if count <= 0 or opts.config_path is None or not upstream:
        return None
    batch = await runtime.service.wait_validated(batch_id)
    if batch.status is not BatchStatus.IN_PROGRESS:
        return None
    shards = await runtime.store.ledger.unfinished_shards(batch_id)
    if sum(s.size for s in shards if runtime.config.lane(s.route) in upstream) < WORKER_MIN_REQUESTS:
        return None
    pool = runtime.worker_pool(count, config_path=opts.config_path, upstream_only=True, verbose=opts.verbose)
    await pool.start()
    return pool


async def _empty_run(runtime: Runtime, opts: RunOptions, started: float) -> int:
    """vLLM run_batch's answer to an empty file: an empty output (and error file), exit status 0."""
    for dest in (opts.output, *([opts.error_file] if opts.error_file else [])):
        try:
            await _copy_out(_nothing, 0, dest)
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


async def _cancel(runtime: Runtime, batch_id: str) -> None:
    with contextlib.suppress(Exception):
        await runtime.service.cancel_batch(batch_id, "")
        async with asyncio.timeout(3.0):
            await runtime.service.wait(batch_id)


async def watch_run(runtime: Runtime, batch_id: str, progress: bool) -> BatchRecord:
    bar: Any = None
    try:
        while True:
            batch = await _get(runtime, batch_id)
            if progress and bar is None and batch.counts.total:
                from tqdm import tqdm

                bar = tqdm(total=batch.counts.total, unit="req", desc="batchyard", file=terminal(), disable=None,
                           initial=batch.counts.completed + batch.counts.failed)
            if bar is not None:
                bar.update(batch.counts.completed + batch.counts.failed - bar.n)
            if batch.status.finished:
                return batch
            answered = batch.counts.total and batch.counts.completed + batch.counts.failed >= batch.counts.total
            # Every line answered: only the merge is left, so look often (it is part of the run's wall time).
            await asyncio.sleep(0.02 if answered else 0.2)
    finally:
        if bar is not None:
            bar.close()


async def deliver_run(runtime: Runtime, batch: BatchRecord, opts: RunOptions) -> int:
    blobs = runtime.blobs
    pairs = [(batch.output_file_id, opts.output)]
    if opts.error_file is not None:
        pairs.append((batch.error_file_id, opts.error_file))
    code = EXIT_OK
    for file_id, dest in pairs:
        read, size = _nothing, 0  # no such file (e.g. no failed request): an empty one, as run_batch writes
        if file_id is not None:
            key = file_key(file_id)
            read, size = functools.partial(blobs.read, key, _CHUNK), await blobs.size(key) or 0
        try:
            await _copy_out(read, size, dest)
        except (TransferError, OSError) as exc:
            kept = Path.cwd() / f"batchyard-{batch.id}-{'errors' if dest == opts.error_file else 'output'}.jsonl"
            await deliver(read, size, str(kept))
            say(f"{exc}; the results are kept in {kept}")
            code = EXIT_DELIVERY
    return code


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


async def _copy_out(read: Reader, size: int, dest: str) -> None:
    if dest == "-":  # the user's stdout (descriptor 1 may be the log file in quiet mode)
        out = stdout_bytes()
        async for chunk in read():
            out.write(chunk)
        out.flush()
        return
    await deliver(read, size, dest, on_retry=say)


__all__ = ["WORKER_MIN_REQUESTS", "RunOptions", "is_url", "run_batch_file"]
