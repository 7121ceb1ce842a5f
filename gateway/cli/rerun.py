"""`batchyard run … --data-dir D --retry-failed`: the lines of the finished run in D without a 2xx, again.

The run is found as a resumed run finds it (the input's hash and the run's options, `offline.previous_run`).
Its lines without a 2xx reply (failed, expired, cancelled before they ran) are chosen by the server's own
retry (`finished.retry_failed.retry_batch`): a new batch in D whose metadata says `retry_of`. When that
batch ends, the run's output (and error) files are rewritten beside the order blob the finalizer wrote
(`lifecycle.order_key`): every line once, in input order, a retried line's new result in its place. Rewritten in
place, so the same command without `--retry-failed` delivers the merged files too, and a second
`--retry-failed` retries what still failed. Memory: one line of each file, whatever the run holds.

A kill is survived at each step: a retry batch not yet finished is continued by the same command; the merged
files are written to staging blobs first (the order blob last, so its presence says all three are whole),
then copied into place, then a marker says the retry is merged; a kill in between redoes only the copies.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

from gateway.cli.console import say
from gateway.cli.offline import EXIT_INPUT, RunOptions, deliver_run, options_key, previous_run, watch_run
from gateway.cli.report import report_invalid
from gateway.cli.transfer import TransferError, read_source
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.errors import Conflict
from gateway.finished.retry_failed import retry_batch
from gateway.pipeline.lifecycle import order_key
from gateway.records import BatchStatus
from gateway.runtime.root import Runtime, open_embedded
from gateway.store.lines import read_lines
from gateway.store.objects import BatchRecord
from gateway.store.protocols import Blobs


async def retry_failed_run(config: Config, opts: RunOptions) -> int:
    assert opts.data_dir is not None  # the command refuses --retry-failed without --data-dir
    digest = hashlib.sha256()
    try:
        async for chunk in read_source(opts.input):
            digest.update(chunk)
    except (TransferError, OSError) as exc:
        say(str(exc))
        return EXIT_INPUT
    runtime = await open_embedded(config, opts.data_dir)
    try:
        return await _retry(runtime, opts, digest.hexdigest())
    finally:
        await runtime.aclose()


async def _retry(runtime: Runtime, opts: RunOptions, input_sha256: str) -> int:
    started = time.monotonic()
    first = await previous_run(runtime, input_sha256, options_key(opts))
    if first is None:
        say(f"no run of this input with these options in {opts.data_dir}: run it first (without --retry-failed; "
            "--error-file must be given, or not, as it was then)")
        return EXIT_INPUT
    if not first.status.finished:
        say(f"the run in {opts.data_dir} (batch {first.id}) is still going: the same command without "
            "--retry-failed continues it; retry what failed once it has finished")
        return EXIT_INPUT
    retry = await _pending_retry(runtime, first.id)
    if retry is None:
        try:
            retry = await retry_batch(runtime.service, first.id, "", None)
        except Conflict as exc:
            if exc.code == "nothing_to_retry":
                say(f"nothing to retry: every line of the run in {opts.data_dir} has a 2xx reply")
                return await deliver_run(runtime, first, opts)
            say(exc.message)
            return EXIT_INPUT
        say(f"retrying {first.id}'s lines without a 2xx reply as batch {retry.id}")
    else:
        say(f"continuing the retry of {first.id} (batch {retry.id})")
    if not retry.status.finished:
        retry = await _run_to_end(runtime, retry.id, opts)
    if retry.status is BatchStatus.FAILED:
        report_invalid(retry)
        return EXIT_INPUT
    ok, failed = await _merge_in(runtime.blobs, first, retry)
    say(f"retried {ok + failed} lines in {time.monotonic() - started:.1f}s: {ok} now succeeded, {failed} "
        "still failed; the output holds every line once, in input order")
    return await deliver_run(runtime, first, opts)


async def _pending_retry(runtime: Runtime, first_id: str) -> BatchRecord | None:
    """The newest retry of this run not yet merged into its files (a kill stopped it), or None."""
    after = None
    while True:
        page = await runtime.store.batches.page("", limit=100, after=after)
        for batch in page.data:
            if (batch.metadata or {}).get("retry_of") == first_id:
                merged = await runtime.blobs.size(_marker(batch.id)) is not None
                return None if merged or batch.status is BatchStatus.FAILED else batch
        if not page.has_more or not page.data:
            return None
        after = page.data[-1].id


async def _run_to_end(runtime: Runtime, batch_id: str, opts: RunOptions) -> BatchRecord:
    if any(r.kind is RouteKind.LOCAL for r in runtime.config.routes.values()):
        from gateway.cli.offline import offline_for_local_models

        offline_for_local_models(runtime.config)
        await runtime.backends.start_local()
    await runtime.start()
    try:
        return await watch_run(runtime, batch_id, opts.progress)
    except asyncio.CancelledError:
        say(f"interrupted; the same command continues the retry (state in {opts.data_dir})")
        raise


def _marker(retry_id: str) -> str:
    return f"results/{retry_id}.merged"


def _staged(first_id: str, part: str) -> str:
    return f"results/{first_id}.retry-{part}"


async def _merge_in(blobs: Blobs, first: BatchRecord, retry: BatchRecord) -> tuple[int, int]:
    """Rewrite the first run's files with the retry's results in place; (now 2xx, still failing) lines."""
    split = first.options.split_errors
    places = {"output": f"files/{first.output_file_id}", "order": order_key(first.id)}
    if split and first.error_file_id is not None:
        places["errors"] = f"files/{first.error_file_id}"
    ok = failed = 0
    if await blobs.size(_staged(first.id, "order")) is None:  # staged whole already: a kill came after
        ok, failed = await _stage(blobs, first, retry, "errors" in places)
    for part, key in places.items():  # the order blob last: a kill before it redoes every copy
        async with blobs.writing(key) as writer:
            async for chunk in blobs.read(_staged(first.id, part), 1 << 20):
                await writer.write(chunk)
    async with blobs.writing(_marker(retry.id)) as writer:
        await writer.write(b"merged\n")
    for part in ("output", "errors", "order"):
        await blobs.delete(_staged(first.id, part))
    return ok, failed


async def _stage(blobs: Blobs, first: BatchRecord, retry: BatchRecord, split: bool) -> tuple[int, int]:
    old_out = _file(blobs, first.output_file_id)
    old_err = _file(blobs, first.error_file_id) if split else old_out
    new_out = _file(blobs, retry.output_file_id)
    new_err = _file(blobs, retry.error_file_id) if split else new_out
    new_order = _entries(blobs, order_key(retry.id))
    ok = failed = 0
    # The order blob's block is the outermost: it appears last, once the files beside it are whole.
    async with blobs.writing(_staged(first.id, "order")) as order, \
            blobs.writing(_staged(first.id, "output")) as out, blobs.writing(_staged(first.id, "errors")) as err:
        async for line, seq, was_ok in _entries(blobs, order_key(first.id)):
            if was_ok:
                now_ok, data = True, await anext(old_out)
            else:
                await anext(old_err)  # the old failure: replaced by the retry's result
                entry = await anext(new_order)
                now_ok = entry[2]
                data = await anext(new_out if now_ok else new_err)
                ok += now_ok
                failed += not now_ok
            await (out if now_ok or not split else err).write(data + b"\n")
            await order.write(b"%d %d %s\n" % (line, seq, b"o" if now_ok else b"e"))
    return ok, failed


async def _file(blobs: Blobs, file_id: str | None) -> AsyncIterator[bytes]:
    if file_id is None:
        return
    async for raw in read_lines(blobs, f"files/{file_id}"):
        if raw:
            yield raw


async def _entries(blobs: Blobs, key: str) -> AsyncIterator[tuple[int, int, bool]]:
    async for raw in read_lines(blobs, key):
        if raw:
            line, seq, kind = raw.split()
            yield int(line), int(seq), kind == b"o"


__all__ = ["retry_failed_run"]
