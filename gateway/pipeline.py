"""The pipeline both front doors drive: ingest, validate + plan, execute, merge.

`Pipeline` owns the batch lifecycle over the `Store`, `Blobs` and `Queue`
interfaces. The HTTP server calls it per request; `batchyard run` runs it
in-process on an embedded store in a temporary directory; `batchyard worker`
runs only its shard loop. There is no second implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Collection
from pathlib import Path
from typing import Any

from gateway import metrics
from gateway.backend import ShardAwareBackend
from gateway.backends import BackendPool
from gateway.config import Config
from gateway.errors import ApiError, not_found
from gateway.merge import merge_shards, seal_shard
from gateway.plan import Planner
from gateway.records import BatchRequest, BatchStatus, Result, Shard, new_id
from gateway.routes import RouteKind
from gateway.store.base import (
    BatchOptions,
    BatchRecord,
    Blobs,
    Delivery,
    FileRecord,
    Queue,
    RequestCounts,
    Store,
    now,
    read_lines,
)
from gateway.urls import normalise_endpoint

log = logging.getLogger("batchyard.pipeline")

FILE_PURPOSES = frozenset({"batch", "batch_output", "fine-tune", "assistants", "vision", "user_data", "evals"})
_NO_EXPIRY = 10 * 365 * 86_400  # the CLI's batches don't expire
_FLUSH_EVERY = 64  # results per journal write
_FLUSH_SECONDS = 0.25
_POLL_SECONDS = 0.5  # how often a running shard looks for cancel and expiry
_MAX_SHARD_ATTEMPTS = 3

StopReason = tuple[str, str]
_CANCELLED: StopReason = ("batch_cancelled", "The batch was cancelled before this request ran.")
_EXPIRED: StopReason = ("batch_expired", "The batch expired before this request ran.")
_LOST: StopReason = ("internal_error", "No result was recorded for this request.")


def _derived_id(prefix: str, batch_id: str, what: str) -> str:
    # Output file ids follow from the batch id (128 random bits), so finalizing
    # twice (a retry after a crash) writes the same files instead of new ones.
    return f"{prefix}-{hashlib.sha256(f'{batch_id}:{what}'.encode()).hexdigest()[:32]}"


def stop_reason(batch: BatchRecord) -> StopReason | None:
    """Why a batch's requests must not run any more, if they mustn't."""
    if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return _CANCELLED
    if batch.expired_at is not None or now() >= batch.expires_at:
        return _EXPIRED
    if batch.status.finished:
        return _LOST
    return None


def _check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ApiError(400, "metadata must be an object of string pairs", param="metadata", code="invalid_metadata")
    if len(metadata) > 16:
        raise ApiError(400, "metadata may hold at most 16 pairs", param="metadata", code="invalid_metadata")
    for key, value in metadata.items():
        if not isinstance(key, str) or len(key) > 64:
            raise ApiError(400, "metadata keys are strings of at most 64 characters", param="metadata",
                           code="invalid_metadata")
        if not isinstance(value, str) or len(value) > 512:
            raise ApiError(400, f"metadata[{key!r}] must be a string of at most 512 characters", param="metadata",
                           code="invalid_metadata")
    return metadata


def _expiry(expires_after: dict[str, Any] | None, created_at: int, param: str) -> int | None:
    if not expires_after:
        return None
    anchor, seconds = expires_after.get("anchor"), expires_after.get("seconds")
    if anchor != "created_at":
        raise ApiError(400, f"{param}[anchor] must be 'created_at'", param=param)
    try:
        secs = int(seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ApiError(400, f"{param}[seconds] must be an integer", param=param) from None
    if not 3600 <= secs <= 2_592_000:
        raise ApiError(400, f"{param}[seconds] must be between 3600 and 2592000", param=param)
    return created_at + secs


class Pipeline:
    def __init__(
        self, config: Config, store: Store, blobs: Blobs, queue: Queue, *,
        worker_routes: Collection[str] | None = None, recover_on_start: bool = True,
    ) -> None:
        self.config, self.store, self.blobs, self.queue = config, store, blobs, queue
        self.backends = BackendPool(config, store)
        self._worker_routes = set(worker_routes) if worker_routes is not None else None
        self._recover_on_start = recover_on_start
        self._tasks: set[asyncio.Task[Any]] = set()
        self._attempts: dict[str, int] = {}
        self._closing = False

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- files -----------------------------------------------------------------

    async def upload_file(
        self, owner: str, filename: str, purpose: str, chunks: AsyncIterable[bytes],
        expires_after: dict[str, Any] | None = None,
    ) -> FileRecord:
        if purpose not in FILE_PURPOSES:
            raise ApiError(400, f"purpose must be one of {', '.join(sorted(FILE_PURPOSES))}", param="purpose")
        created = now()
        expires_at = _expiry(expires_after, created, "expires_after")
        file_id = new_id("file")
        key = f"files/{file_id}"
        limit = self.config.batch.limits.max_file_bytes
        writer = self.blobs.writer(key)
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the file is larger than the limit of {limit} bytes", param="file",
                                   code="file_too_large")
                await writer.write(chunk)
        except BaseException:
            await writer.abort()
            raise
        await writer.commit()
        rec = FileRecord(file_id, owner, size, created, filename, purpose, expires_at, key)
        await self.store.put_file(rec)
        return rec

    def open_file(self, rec: FileRecord) -> AsyncIterator[bytes]:
        return self.blobs.read(rec.blob_key)

    async def delete_file(self, file_id: str, owner: str) -> bool:
        rec = await self.store.get_file(file_id, owner)
        if rec is None or not await self.store.delete_file(file_id, owner):
            return False
        await self.blobs.delete(rec.blob_key)
        return True

    # -- batches ----------------------------------------------------------------

    async def create_batch(
        self, owner: str, *, input_file_id: str, endpoint: str | None, completion_window: str | None,
        metadata: dict[str, Any] | None = None, output_expires_after: dict[str, Any] | None = None,
        allowed_models: list[str] | None = None, strict: bool = True, split_errors: bool = True,
        run_batch_errors: bool = False,
    ) -> BatchRecord:
        """A new batch in `validating`; validation and execution go on in the background.

        `endpoint=None` and `completion_window=None` are the CLI's: any url, no expiry.
        """
        if endpoint is not None and normalise_endpoint(endpoint) is None:
            raise ApiError(400, f"endpoint {endpoint!r} is not supported", param="endpoint",
                           code="invalid_endpoint")
        if completion_window is None:
            window = _NO_EXPIRY
        elif completion_window in self.config.batch.completion_windows:
            window = self.config.batch.completion_windows[completion_window]
        else:
            allowed = ", ".join(self.config.batch.completion_windows)
            raise ApiError(400, f"completion_window must be one of: {allowed}", param="completion_window",
                           code="invalid_completion_window")
        meta = _check_metadata(metadata)
        source = await self.store.get_file(input_file_id, owner)
        if source is None:
            raise not_found("file", input_file_id)
        if source.purpose != "batch":
            raise ApiError(400, f"file {input_file_id} has purpose {source.purpose!r}, not 'batch'",
                           param="input_file_id", code="invalid_file")
        created = now()
        _expiry(output_expires_after, created, "output_expires_after")  # checked now, applied at the end
        batch = BatchRecord(
            id=new_id("batch"), owner=owner, endpoint=endpoint or "*", input_file_id=input_file_id,
            completion_window=completion_window or "none", status=BatchStatus.VALIDATING, created_at=created,
            expires_at=created + window, metadata=meta, output_expires_after=output_expires_after,
            options=BatchOptions(strict=strict, split_errors=split_errors, allowed_models=allowed_models,
                                 run_batch_errors=run_batch_errors),
        )
        await self.store.put_batch(batch)
        self._spawn(self._validate(batch.id), f"validate-{batch.id}")
        return batch

    async def cancel_batch(self, batch_id: str, owner: str) -> BatchRecord:
        batch = await self.store.get_batch(batch_id, owner)
        if batch is None:
            raise not_found("batch", batch_id)
        cancellable = {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS}
        if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch
        ok = await self.store.update_batch(
            batch_id, {"status": BatchStatus.CANCELLING, "cancelling_at": now()}, if_status=cancellable
        )
        if not ok:
            batch = await self.store.get_batch(batch_id, owner)
            assert batch is not None
            if batch.status is not BatchStatus.CANCELLING:
                raise ApiError(409, f"Cannot cancel a batch with status '{batch.status.value}'.",
                               code="batch_not_cancellable")
        refreshed = await self.store.get_batch(batch_id, owner)
        assert refreshed is not None
        return refreshed

    async def wait(self, batch_id: str, poll: float = 0.2) -> BatchRecord:
        """Until the batch is finished (the CLI's loop; servers don't block on a batch)."""
        while True:
            batch = await self.store.get_batch(batch_id)
            if batch is None:
                raise not_found("batch", batch_id)
            if batch.status.finished:
                return batch
            await asyncio.sleep(poll)

    # -- validate + plan ----------------------------------------------------------

    async def _validate(self, batch_id: str) -> None:
        batch = await self.store.get_batch(batch_id)
        if batch is None or (batch.status is not BatchStatus.VALIDATING and batch.status is not BatchStatus.CANCELLING):
            return
        source = await self.store.get_file(batch.input_file_id)
        if source is None:
            await self._fail(batch_id, [{"code": "invalid_file", "message": "the input file was deleted",
                                         "param": "input_file_id", "line": None}])
            return
        planner = Planner(
            self.config, self.blobs, batch_id,
            endpoint=normalise_endpoint(batch.endpoint) if batch.endpoint != "*" else None,
            strict=batch.options.strict, allowed_models=batch.options.allowed_models,
        )
        outcome = await planner.plan(read_lines(self.blobs, source.blob_key))
        if outcome.failed:
            await self._fail(batch_id, [e.to_openai() for e in outcome.errors])
            await self.blobs.delete_prefix(f"batches/{batch_id}")
            return
        shards = [*outcome.shards, *([outcome.answered] if outcome.answered else [])]
        await self.store.put_shards(batch_id, shards)
        if outcome.answered is not None:
            await self._count_answered(outcome.answered)
        model = next(iter(outcome.models)) if len(outcome.models) == 1 else None
        await self.store.update_batch(batch_id, {"counts": {"total": outcome.total, "completed": 0, "failed": 0},
                                                 "model": model, "shards_total": len(shards)})
        await self.store.update_batch(
            batch_id, {"status": BatchStatus.IN_PROGRESS, "in_progress_at": now()},
            if_status={BatchStatus.VALIDATING},
        )
        if outcome.answered is not None:
            await self._finish(outcome.answered)
        for shard in outcome.shards:
            await self.queue.put(shard)

    async def _count_answered(self, shard: Shard) -> None:
        # Lines answered in place count as failed requests, like any other.
        buf: list[Result] = []
        async for raw in read_lines(self.blobs, shard.results_key):
            if raw:
                buf.append(Result.from_json(json.loads(raw)))
            if len(buf) >= 500:
                await self.store.record_results(shard, buf)
                metrics.observe_results(await metrics.team_of(self.store, shard.batch_id), shard.route, buf)
                buf = []
        if buf:
            await self.store.record_results(shard, buf)
            metrics.observe_results(await metrics.team_of(self.store, shard.batch_id), shard.route, buf)
        await self.store.drop_journal(shard)

    async def _fail(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        await self.store.update_batch(
            batch_id, {"status": BatchStatus.FAILED, "failed_at": now(), "errors": errors},
            if_status={BatchStatus.VALIDATING, BatchStatus.CANCELLING},
        )

    # -- execute --------------------------------------------------------------------

    async def run_shard(self, shard: Shard) -> None:
        """Run a shard's unfinished requests, seal it, and finalize the batch if it was the last."""
        if await self.blobs.size(shard.results_key) is not None:
            await self._finish(shard)  # sealed before a crash; only the bookkeeping is left
            return
        batch = await self.store.get_batch(shard.batch_id)
        if batch is None:
            return
        reason = stop_reason(batch)
        if reason is None:
            requests = [
                BatchRequest.from_json(json.loads(raw))
                async for raw in read_lines(self.blobs, shard.requests_key)
                if raw
            ]
            recorded = await self.store.recorded_lines(shard)
            todo = [r for r in requests if r.line not in recorded]
            if todo:
                reason = await self._execute(shard, todo)
        if reason is None:
            await seal_shard(self.store, self.blobs, shard, missing=None)
        await self._finish(shard)

    async def _execute(self, shard: Shard, todo: list[BatchRequest]) -> StopReason | None:
        backend = await self.backends.get(shard.route)
        buffer: list[Result] = []
        flushed_at = time.monotonic()

        async def flush() -> None:
            nonlocal buffer, flushed_at
            if buffer:
                batch, buffer = buffer, []
                await self.store.record_results(shard, batch)
                metrics.observe_results(await metrics.team_of(self.store, shard.batch_id), shard.route, batch)
            flushed_at = time.monotonic()

        if isinstance(backend, ShardAwareBackend):
            results = backend.execute_shard(shard, todo)
        else:
            results = backend.execute(todo)

        async def consume() -> None:
            async for result in results:
                buffer.append(result)
                if len(buffer) >= _FLUSH_EVERY or time.monotonic() - flushed_at > _FLUSH_SECONDS:
                    await flush()

        consumer = asyncio.create_task(consume(), name=f"shard-{shard.key}")
        try:
            while True:
                done, _ = await asyncio.wait({consumer}, timeout=_POLL_SECONDS)
                if done:
                    consumer.result()  # a bug in a backend surfaces here
                    return None
                await flush()  # slow results still get recorded promptly
                batch = await self.store.get_batch(shard.batch_id)
                reason = stop_reason(batch) if batch is not None else _LOST
                if reason is not None:
                    return reason
        finally:
            if not consumer.done():
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
            await flush()

    async def _finish(self, shard: Shard) -> None:
        if await self.store.finish_shard(shard) == 0:
            await self.finalize(shard.batch_id)

    # -- merge ----------------------------------------------------------------------

    async def finalize(self, batch_id: str) -> None:
        batch = await self.store.get_batch(batch_id)
        if batch is None or batch.status.finished:
            return
        reason = stop_reason(batch)
        if batch.status is BatchStatus.IN_PROGRESS and reason is None:
            await self.store.update_batch(batch_id, {"status": BatchStatus.FINALIZING, "finalizing_at": now()},
                                          if_status={BatchStatus.IN_PROGRESS})
        shards = await self.store.get_shards(batch_id)
        for shard in shards:
            await seal_shard(self.store, self.blobs, shard, missing=reason or _LOST)
        output_id = _derived_id("file", batch_id, "output")
        error_id = _derived_id("file", batch_id, "errors") if batch.options.split_errors else None
        summary, n_out, n_err = await merge_shards(
            self.blobs, shards, f"files/{output_id}", f"files/{error_id}" if error_id else None,
            run_batch_errors=batch.options.run_batch_errors,
        )
        created = now()
        expires_at = _expiry(batch.output_expires_after, created, "output_expires_after")
        fields: dict[str, Any] = {"routes": {**batch.routes, "summary": summary.to_json()}}
        native = [r for r in {s.route for s in shards} if (route := self.config.routes.get(r)) and
                  route.kind is RouteKind.NATIVE]
        if native:
            from providers.native import native_route_summary

            for name in native:
                fields["routes"][name] = await native_route_summary(self.store, batch_id, name)
        for file_id, count, what in ((output_id, n_out, "output"), (error_id, n_err, "error")):
            if file_id is None:
                continue
            key = f"files/{file_id}"
            if count == 0 and (what == "error" or batch.options.split_errors):
                await self.blobs.delete(key)
                continue
            size = await self.blobs.size(key) or 0
            await self.store.put_file(FileRecord(file_id, batch.owner, size, created, f"{batch_id}_{what}.jsonl",
                                                 "batch_output", expires_at, key))
            fields[f"{what}_file_id"] = file_id
        if reason is _CANCELLED:
            fields.update(status=BatchStatus.CANCELLED, cancelled_at=now())
        elif reason is _EXPIRED:
            fields.update(status=BatchStatus.EXPIRED, expired_at=batch.expired_at or now())
        else:
            fields.update(status=BatchStatus.COMPLETED, completed_at=now())
        await self.store.update_batch(batch_id, fields)
        await self.blobs.delete_prefix(f"batches/{batch_id}")
        if native:  # after the record holds the summary: a re-run finalize still finds the state
            from providers.native import drop_native_state

            await drop_native_state(self.store, batch_id)

    # -- workers and upkeep -------------------------------------------------------------

    async def start(self, workers: bool = True) -> None:
        if workers:
            await self.backends.warm_up()
        if self._recover_on_start:
            await self.recover()
        if workers:
            self._spawn(self._worker_loop(), "worker")
        self._spawn(self._janitor_loop(), "janitor")

    async def recover(self) -> None:
        """Pick up what a killed process left: re-validate, re-enqueue unfinished shards, re-finalize."""
        for batch in await self.store.active_batches():
            if batch.status is BatchStatus.VALIDATING:
                self._spawn(self._validate(batch.id), f"validate-{batch.id}")
                continue
            if batch.status is BatchStatus.CANCELLING and batch.shards_total == 0:
                await self._fail(batch.id, [])  # cancelled while validating, before any shard existed
                await self.store.update_batch(batch.id, {"status": BatchStatus.CANCELLED, "cancelled_at": now()})
                continue
            unfinished = await self.store.unfinished_shards(batch.id)
            if not unfinished:
                self._spawn(self.finalize(batch.id), f"finalize-{batch.id}")
            for shard in unfinished:
                await self.queue.put(shard)

    async def _worker_loop(self) -> None:
        slots = asyncio.Semaphore(self.config.batch.max_shards_in_flight)
        while not self._closing:
            await slots.acquire()
            try:
                delivery = await self.queue.get(self._worker_routes, timeout=1.0)
            except Exception:
                slots.release()
                log.exception("queue read failed; retrying")
                await asyncio.sleep(1.0)
                continue
            if delivery is None:
                slots.release()
                continue
            task = self._spawn(self._process(delivery), f"shard-{delivery.shard.key}")
            task.add_done_callback(lambda _t: slots.release())

    async def _process(self, delivery: Delivery) -> None:
        shard = delivery.shard
        try:
            await self.run_shard(shard)
        except asyncio.CancelledError:
            raise
        except Exception:
            attempts = self._attempts[shard.key] = self._attempts.get(shard.key, 0) + 1
            log.exception("shard %s failed (attempt %d)", shard.key, attempts)
            if attempts < _MAX_SHARD_ATTEMPTS:
                await asyncio.sleep(attempts)
                await self.queue.put(shard)
            else:  # give up on the shard, never on its lines: they get error results
                await seal_shard(self.store, self.blobs, shard, missing=_LOST)
                await self._finish(shard)
        await self.queue.ack(delivery)

    async def _janitor_loop(self) -> None:
        while not self._closing:
            try:
                await self._expire_batches()
            except Exception:
                log.exception("janitor pass failed")
            await asyncio.sleep(1.0)

    async def _expire_batches(self) -> None:
        t = now()
        for batch in await self.store.active_batches():
            if batch.expired_at is None and t >= batch.expires_at and batch.status is not BatchStatus.CANCELLING:
                await self.store.update_batch(batch.id, {"expired_at": t})
                if batch.status is BatchStatus.VALIDATING:
                    await self.store.update_batch(batch.id, {"status": BatchStatus.EXPIRED},
                                                  if_status={BatchStatus.VALIDATING})

    async def health(self) -> dict[str, Any]:
        return {"queue_depth": await self.queue.depth()}

    async def aclose(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.backends.aclose()
        await self.queue.aclose()
        await self.blobs.aclose()
        await self.store.aclose()


async def open_embedded(config: Config, data_dir: Path, *, recover_on_start: bool = True) -> Pipeline:
    """The embedded default: SQLite records, a local blob directory, an in-process queue."""
    from gateway.store.local import LocalBlobs
    from gateway.store.memory_queue import MemoryQueue
    from gateway.store.sqlite import SQLiteStore

    data_dir.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(data_dir / "batchyard.sqlite3")
    return Pipeline(config, store, LocalBlobs(data_dir / "blobs"), MemoryQueue(), recover_on_start=recover_on_start)


__all__ = ["Pipeline", "RequestCounts", "open_embedded", "stop_reason"]
