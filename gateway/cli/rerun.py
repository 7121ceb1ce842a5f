"""`batchyard run … --data-dir D --retry-failed`: the lines of the finished run in D without a 2xx, again.

The run is found as a resumed run finds it (the input's hash and the run's options, `offline.previous_run`).
Its lines without a 2xx reply (failed, expired, cancelled before they ran) are chosen by the server's own
retry (`finished.retry_failed.retry_batch`): a new batch in D whose metadata says `retry_of`. When that
batch ends, the run's output (and error) files are rewritten with the retry's results in place
(`gateway.finished.retry_merge`), so the same command without `--retry-failed` delivers the merged files too,
and a second `--retry-failed` retries what still failed. A retry batch not yet finished when a kill came is
continued by the same command.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from gateway.cli.console import say
from gateway.cli.offline import EXIT_INPUT, RunOptions, deliver_run, options_key, previous_run, watch_run
from gateway.cli.report import report_invalid
from gateway.cli.transfer import TransferError, read_source
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.domain import BatchStatus
from gateway.errors import Conflict
from gateway.finished.retry_failed import retry_batch
from gateway.finished.retry_merge import is_merged, merge_retry
from gateway.runtime.runtime import Runtime, open_embedded
from gateway.store.records import BatchRecord


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
    ok, failed = await merge_retry(runtime.blobs, first, retry)
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
                merged = await is_merged(runtime.blobs, batch.id)
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


__all__ = ["retry_failed_run"]
