"""The intake: the batch/file service that both front doors (the API, the CLI) ask.

Create, read, cancel and delete files and batches; admit a new batch against its team's quotas and
budget; validate and plan it into shards, record them and put them on the queue. Refusals are domain
errors (`gateway.errors`); the server maps them to HTTP. The intake owns a batch while it is `validating`: it fails it,
cancels it before any shard exists, or expires it (the sweeper asks).
Running the shards is the `ShardRunner`'s job, finishing the batch the `Finalizer`'s.

What it needs from later stages or higher layers is handed in, never imported:
`finish_shard` (the finalizer's), `announce` (the webhooks'), `spawn` (the
runtime's tasks) and `plan` (the runtime's validation processes, where it has them).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from gateway import metrics, tracing
from gateway.config.schema import Config
from gateway.config.urls import normalise_endpoint
from gateway.domain import BatchStatus, Endpoint, Shard, new_id
from gateway.errors import Conflict, InvalidRequest, OverQuota, TooLarge, invalid_value, not_found
from gateway.lines.budget import Budgets, create_hold
from gateway.lines.reservation import batch_holds
from gateway.pipeline.batch_params import ExpiresAfter, checked, checked_metadata
from gateway.pipeline.input_files import read_by, release_input
from gateway.pipeline.lifecycle import NO_EXPIRY, Announce, announce_nothing, expiry, for_queue, results_batch
from gateway.pipeline.plan import PlanJob, PlanOutcome, plan_batch
from gateway.pipeline.validate import count_lines
from gateway.store.blobs.keys import batch_prefix, file_key, order_key
from gateway.store.faults import machine_fault
from gateway.store.protocols import Blobs, Coordination, Queue, Store
from gateway.store.quota import MAX_ACTIVE_BATCHES, MODEL_MAX_ENQUEUED_REQUESTS, TeamLimits, over_model
from gateway.store.records import BatchOptions, BatchRecord, FileRecord, RequestCounts, now, storage_team
from gateway.store.storage import StorageMeter, over_limit

log = logging.getLogger("batchyard.service")

FILE_PURPOSES = frozenset({"batch", "batch_output", "fine-tune", "assistants", "vision", "user_data", "evals"})

Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]
# Validates and plans a batch's input file into shard blobs: in place by default, in processes of their own
# where the runtime serves the API (`gateway.runtime.validation_processes`).
Plan = Callable[[PlanJob], Awaitable[PlanOutcome]]
# A batch's estimated cost in USD, for a create that reserves it (handed in: the estimate is a later layer).
EstimateCost = Callable[[BatchRecord, FileRecord], Awaitable[float]]


class BatchService:
    def __init__(
        self, config: Config, store: Store, blobs: Blobs, queue: Queue, coordination: Coordination, *,
        spawn: Spawn, finish_shard: Callable[[Shard], Awaitable[None]], announce: Announce = announce_nothing,
        budgets: Budgets | None = None, plan: Plan | None = None, estimate_cost: EstimateCost | None = None,
        file_stored: Callable[[FileRecord], None] | None = None,
    ) -> None:
        self.config, self.store, self.blobs, self.queue = config, store, blobs, queue
        self._coordination, self._spawn, self._finish_shard = coordination, spawn, finish_shard
        self._announce = announce
        self._plan: Plan = plan or functools.partial(plan_batch, config, blobs)
        self._estimate_cost = estimate_cost
        self.file_stored = file_stored or (lambda file: None)  # told of each new file (its estimate starts)
        self.quotas = store.quota
        self.budgets = budgets or Budgets(config, self.quotas)
        self._limits = {t.team_id: TeamLimits(t.max_enqueued_requests, t.max_active_batches,
                                              t.model_max_enqueued_requests) for t in config.batch.teams}
        self._storage_limits = {t.team_id: t.max_file_storage_bytes for t in config.batch.teams
                                if t.max_file_storage_bytes is not None}
        self._max_lines = {t.team_id: t.max_lines for t in config.batch.teams if t.max_lines is not None}

    # -- files -----------------------------------------------------------------

    async def upload_file(
        self, owner: str, filename: str, purpose: str, chunks: AsyncIterable[bytes],
        expires_after: ExpiresAfter | Mapping[str, Any] | None = None,
    ) -> FileRecord:
        if purpose not in FILE_PURPOSES:
            raise invalid_value(purpose, sorted(FILE_PURPOSES), "purpose")
        created = now()
        expires_at = expiry(expires_after, created, "expires_after")
        if expires_at is None and self.config.batch.file_expiry_seconds is not None:
            expires_at = created + self.config.batch.file_expiry_seconds
        file_id = new_id("file", sep="-")  # older data dirs hold `file_` ids: still valid
        key = file_key(file_id)
        limit = self.config.batch.limits.max_file_bytes
        size = 0
        team = storage_team(owner)  # one account per team, whatever door made the file
        meter = StorageMeter(self.store.storage, team, file_id, self.storage_limit(team))
        try:
            async with self.blobs.writing(key) as writer:  # refused or failed: the blob is aborted, never kept
                async for chunk in meter.metered(chunks):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"the file is larger than the limit of {limit} bytes", param="file",
                                       code="file_too_large")
                    await writer.write(chunk)
            rec = FileRecord(file_id, owner, size, created, filename, purpose, expires_at, key)
            await self.store.files.put(rec)
        except BaseException:
            await self.store.storage.release(team, file_id)
            raise
        await self.store.storage.settle(team, file_id, size)
        self.file_stored(rec)
        return rec

    def storage_limit(self, team: str) -> int | None:
        return self._storage_limits.get(team, self.config.batch.max_file_storage_bytes)

    async def check_room(self, owner: str, size: int) -> None:
        """Before a door reads a body of `size` bytes (its declared length): refused at once (429) when the
        team's budget is spent, its active batches are at their limit or its storage has no room for it;
        the upload and `create_batch` check again, atomically, as the bytes come."""
        await self._check_budget(owner)
        limits = self._limits.get(owner)
        if limits is not None and limits.max_active_batches is not None:
            usage = await self.quotas.usage(owner)
            if usage.active_batches + 1 > limits.max_active_batches:
                raise self._over_active(owner, limits, usage.active_batches)
        team = storage_team(owner)
        if (room := self.storage_limit(team)) is not None:
            used = await self.store.storage.used(team)
            if used + size > room:
                raise over_limit(team, room, used)

    async def set_file_expiry(self, rec: FileRecord, expires_after: ExpiresAfter) -> FileRecord:
        """A stored file's `expires_after`, given after its bytes (a form field after the file part)."""
        rec.expires_at = expires_after.at(rec.created_at)
        await self.store.files.put(rec)
        return rec

    def open_file(self, rec: FileRecord) -> AsyncIterator[bytes]:
        return self.blobs.read(rec.blob_key)

    async def delete_file(self, file_id: str, owner: str | None) -> bool:
        rec = await self.store.files.get(file_id, owner)
        if rec is None:
            return False
        team = storage_team(rec.owner)
        await self.store.storage.hold(team, file_id)  # a crash from here on cannot leave its bytes counted
        if not await self.store.files.delete(file_id, owner):
            return False
        if not await read_by(self.store, file_id):  # else its bytes stay until the batches reading them end
            await self.blobs.delete(rec.blob_key)
        if (batch_id := results_batch(rec)) is not None:  # the results' order goes with the files it orders
            await self.blobs.delete(order_key(batch_id))
        await self.store.storage.release(team, file_id)  # its bytes are free once they are gone
        return True

    async def delete_expired_files(self) -> int:
        """Remove files past their `expires_at` (uploads and outputs alike); returns how many went."""
        gone = 0
        for rec in await self.store.files.expired(now()):
            gone += int(await self.delete_file(rec.id, None))
        return gone

    # -- batches ----------------------------------------------------------------

    async def create_batch(
        self, owner: str, *, input_file_id: str, endpoint: str | None, completion_window: str | None,
        metadata: Mapping[str, str] | None = None,
        output_expires_after: ExpiresAfter | Mapping[str, Any] | None = None,
        allowed_models: list[str] | None = None, options: BatchOptions | None = None,
        kind: str = "batch", input_owner: str | None = None,
    ) -> BatchRecord:
        """A new batch in `validating`; validation goes on in the background.

        `endpoint=None` and `completion_window=None` are the CLI's: any url, no expiry. `kind`: the id's
        prefix (`msgbatch` for Anthropic's Message Batches); `input_owner`: the owner of the input file when
        it is not the batch's (a Message Batch's own file, kept out of the team's files list).
        """
        if endpoint is not None and normalise_endpoint(endpoint) is None:
            raise invalid_value(endpoint, [e.value for e in Endpoint], "endpoint")
        if completion_window is None:
            window = NO_EXPIRY
        elif completion_window in self.config.batch.completion_windows:
            window = self.config.batch.completion_windows[completion_window]
        else:
            raise invalid_value(completion_window, list(self.config.batch.completion_windows), "completion_window")
        meta = checked_metadata(metadata)
        source = await self.store.files.get(input_file_id, owner if input_owner is None else input_owner)
        if source is None:
            raise not_found("file", input_file_id, "input_file_id")
        if source.purpose != "batch":
            raise InvalidRequest(f"file {input_file_id} has purpose {source.purpose!r}, not 'batch'",
                                 param="input_file_id", code="invalid_file")
        created = now()
        output_expiry = checked(ExpiresAfter, output_expires_after, "output_expires_after") if output_expires_after \
            else None  # checked now, applied when the output is written
        opts = options or BatchOptions()
        opts.allowed_models = allowed_models
        batch = BatchRecord(
            id=new_id(kind), owner=owner, endpoint=endpoint or "*", input_file_id=input_file_id,
            completion_window=completion_window or "none", status=BatchStatus.VALIDATING, created_at=created,
            expires_at=created + window, metadata=meta, options=opts,
            output_expires_after=output_expiry.model_dump() if output_expiry else None, input_key=source.blob_key,
        )
        with tracing.batch_create(batch):  # sets batch.trace_context: the trace every later stage joins
            hold = await self._reserve(batch, source)
            try:
                await self._admit(batch, source)
                await self.store.batches.put(batch)
            except BaseException:  # refused or failed: the batch holds nothing
                await self.budgets.unreserve(batch.owner, hold) if hold is not None else None
                raise
        self._spawn(self.validate(batch.id), f"validate-{batch.id}")
        return batch

    async def _reserve(self, batch: BatchRecord, source: FileRecord) -> str | None:
        """The hold of the batch's whole estimate (`budget_reservation: estimate`; 429 if it does not fit)."""
        if self._estimate_cost is None or not self.budgets.reserves_at_create(batch.owner):
            return None
        hold, usd = create_hold(batch.id, batch.created_at), await self._estimate_cost(batch, source)
        try:  # the hold's one step reads the spend: read again only for a refusal's words
            await self.budgets.hold_estimate(batch.owner, hold, usd)
        except OverQuota:
            await self._check_budget(batch.owner)  # a spent budget is `budget_exceeded`, as without a hold
            raise
        return hold

    async def _admit(self, batch: BatchRecord, source: FileRecord) -> None:
        """Count the batch against its team's quotas, or refuse it (429, the code names the quota)."""
        await self._check_budget(batch.owner)
        limits = self._limits.get(batch.owner)
        if limits is None or limits == TeamLimits():
            return
        per_model = bool(limits.model_max_enqueued_requests)
        requests, by_model = (await count_lines(self.config, self.blobs.read(source.blob_key), per_model)
                              if limits.max_enqueued_requests is not None or per_model else (0, {}))
        refused = await self.quotas.admit(batch.owner, batch.id, requests, limits, by_model)
        if refused is None:
            return
        usage = await self.quotas.usage(batch.owner)
        if refused == MAX_ACTIVE_BATCHES:
            raise self._over_active(batch.owner, limits, usage.active_batches)
        if refused == MODEL_MAX_ENQUEUED_REQUESTS:
            model = over_model(usage, by_model, limits) or "?"  # the usage read again: it may have moved since
            raise OverQuota(f"Enqueued request limit reached for {model} for team {batch.owner!r}. Limit: "
                            f"{limits.model_max_enqueued_requests.get(model)} enqueued requests "
                            f"({usage.by_model.get(model, 0)} enqueued, this batch has {by_model.get(model, 0)}). "
                            "Try again once some in_progress batches have completed.",
                            code="model_max_enqueued_requests_exceeded")
        raise OverQuota(f"Enqueued request limit reached for team {batch.owner!r}. Limit: "
                        f"{limits.max_enqueued_requests} enqueued requests ({usage.enqueued_requests} enqueued, this "
                        f"batch has {requests}). Try again once some in_progress batches have completed.",
                        code="max_enqueued_requests_exceeded")

    async def _check_budget(self, owner: str) -> None:
        if await self.budgets.over(owner):
            spent, limit = await self.budgets.spent(owner), self.budgets.limit(owner)
            raise OverQuota(f"Budget has been exceeded for team {owner!r}: spent {spent:.6f} USD, max_budget "
                            f"{limit} USD. New batches are refused until the budget period resets.",
                            code="budget_exceeded")

    @staticmethod
    def _over_active(owner: str, limits: TeamLimits, active: int) -> OverQuota:
        return OverQuota(f"Active batch limit reached for team {owner!r}. Limit: {limits.max_active_batches} "
                         f"active batches ({active} now). Try again once a batch has finished.",
                         code="max_active_batches_exceeded")

    async def cancel_batch(self, batch_id: str, owner: str) -> BatchRecord:
        batch = await self.store.batches.get(batch_id, owner)
        if batch is None:
            raise not_found("batch", batch_id)
        if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch
        cancellable = {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS}
        ok = await self.store.batches.update(
            batch_id, {"status": BatchStatus.CANCELLING, "cancelling_at": now()}, if_status=cancellable
        )
        refreshed = await self.store.batches.get(batch_id, owner)
        assert refreshed is not None
        if not ok and refreshed.status is not BatchStatus.CANCELLING:
            raise Conflict(f"Cannot cancel a batch with status '{refreshed.status.value}'.",
                           code="batch_not_cancellable")
        return refreshed

    async def wait(self, batch_id: str, poll: float = 0.2) -> BatchRecord:
        """Until the batch is finished (the CLI's loop; servers don't block on a batch)."""
        return await self._wait_for(batch_id, lambda b: b.status.finished, poll)

    async def wait_validated(self, batch_id: str, poll: float = 0.05) -> BatchRecord:
        """Until the batch has left `validating`."""
        return await self._wait_for(batch_id, lambda b: b.status is not BatchStatus.VALIDATING, poll)

    async def _wait_for(self, batch_id: str, reached: Callable[[BatchRecord], bool], poll: float) -> BatchRecord:
        while True:
            batch = await self.store.batches.get(batch_id)
            if batch is None:
                raise not_found("batch", batch_id)
            if reached(batch):
                return batch
            await asyncio.sleep(poll)

    # -- validate + plan ----------------------------------------------------------

    async def validate(self, batch_id: str) -> None:
        """Plan a `validating` batch into shards and queue them (or fail it). Under a lease: one process."""
        async with self._coordination.lease(f"validate:{batch_id}") as ours:
            if ours:
                with tracing.stage("batch.validate", await self.store.batches.get(batch_id)
                                   if tracing.enabled() else None):
                    await self._validate(batch_id)

    async def _validate(self, batch_id: str) -> None:
        batch = await self.store.batches.get(batch_id)
        if batch is None or batch.status not in (BatchStatus.VALIDATING, BatchStatus.CANCELLING):
            return
        if batch.status is BatchStatus.CANCELLING:
            if batch.shards_total == 0:  # cancelled while validating, before any shard existed
                await self._announce(batch.owner, batch_id, BatchStatus.CANCELLED)
                await self.store.batches.update(batch_id, {"status": BatchStatus.CANCELLED, "cancelled_at": now()},
                                              if_status={BatchStatus.CANCELLING})
                await release_input(self.store, self.blobs, batch)
            return
        source = await self.store.files.get(batch.input_file_id)
        if source is None:
            await self._fail(batch, [{"code": "invalid_file", "message": "the input file was deleted",
                                         "param": "input_file_id", "line": None}])
            return
        try:
            outcome = await self._plan(PlanJob(
                batch_id, source.blob_key,
                endpoint=normalise_endpoint(batch.endpoint) if batch.endpoint != "*" else None,
                strict=batch.options.strict, allowed_models=batch.options.allowed_models,
                trace_context=tracing.headers() or None, max_lines=self._max_lines.get(batch.owner),
            ))
        except BrokenProcessPool:
            raise  # the validation process died (killed, out of memory): the sweep validates the batch again
        except Exception as exc:
            fault = machine_fault(exc)
            if fault is not None:  # a full disk, S3 down: not the file's fault; the sweep validates it again
                log.warning("validating batch %s waits: %s unavailable (%s: %s); the sweep validates it again",
                            batch_id, fault.service, fault.words, fault.detail)
                metrics.observe_machine_fault(fault.kind)
                return
            # Anything else would fail again at every sweep until the batch expired: fail it now, once.
            log.exception("validating batch %s failed", batch_id)
            await self._fail(batch, [{"code": "validation_failed", "message": "The input file could not be "
                                      "validated; the batch was not run.", "param": None, "line": None}])
            await self.blobs.delete_prefix(batch_prefix(batch_id))
            return
        if outcome.failed:
            await self._fail(batch, [e.to_openai() for e in outcome.errors])
            await self.blobs.delete_prefix(batch_prefix(batch_id))
            return
        shards = [*outcome.shards, *([outcome.answered] if outcome.answered else [])]
        await self.store.ledger.put_shards(batch_id, shards)
        if outcome.answered is not None:
            # Lines answered in place count as failed requests, like any other: the planner counted them.
            await self.store.ledger.record_answered(outcome.answered, outcome.answered_statuses.total())
            metrics.observe_statuses(batch.owner, outcome.answered.route, outcome.answered_statuses)
        model = next(iter(outcome.models)) if len(outcome.models) == 1 else None
        await self.store.batches.update(batch_id, {"counts": RequestCounts(total=outcome.total), "model": model,
                                                 "shards_total": len(shards)})
        started = await self.store.batches.update(
            batch_id, {"status": BatchStatus.IN_PROGRESS, "in_progress_at": now()},
            if_status={BatchStatus.VALIDATING},
        )
        if not started:
            return  # cancelled or expired meanwhile: the sweeper finalizes it from the shards
        tracing.status_event(BatchStatus.IN_PROGRESS, lines=outcome.total, shards=len(shards))
        if outcome.answered is not None:
            await self._finish_shard(outcome.answered)  # the last one when every line was answered in place
        for shard in outcome.shards:
            await self.queue.put(for_queue(shard, batch))

    async def expire(self, batch: BatchRecord) -> None:
        """A batch past its `expires_at` while still `validating` (the sweep found it): it ends `expired`
        with no shard to finalize."""
        await self.budgets.unreserve(batch.owner, batch_holds(batch.id))
        await self._announce(batch.owner, batch.id, BatchStatus.EXPIRED)
        await self.store.batches.update(batch.id, {"status": BatchStatus.EXPIRED},
                                      if_status={BatchStatus.VALIDATING})
        await release_input(self.store, self.blobs, batch)

    async def _fail(self, batch: BatchRecord, errors: list[dict[str, Any]]) -> None:
        await self.budgets.unreserve(batch.owner, batch_holds(batch.id))  # it never runs: its hold goes
        tracing.status_event(BatchStatus.FAILED)
        await self._announce(batch.owner, batch.id, BatchStatus.FAILED)
        await self.store.batches.update(
            batch.id, {"status": BatchStatus.FAILED, "failed_at": now(), "errors": errors},
            if_status={BatchStatus.VALIDATING, BatchStatus.CANCELLING},
        )
        await release_input(self.store, self.blobs, batch)


__all__ = ["FILE_PURPOSES", "BatchService", "EstimateCost", "Plan"]
