"""The finalizer: a batch whose shards are all finished becomes its output files.

Seal what is left unsealed (requests that never ran get error results), k-way
merge the sealed shards into the output and error files, record usage, cost
and per-route facts, and set the final status. Under a lease, so one process
does it; idempotent, so a finalizer that died mid-way can be run again: the
merge deletes each shard's results as it merges them, and goes on from its
checkpoint (`gateway.pipeline.checkpoint`) rather than beginning again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway import tracing
from gateway.backends.interface import RouteReporter
from gateway.domain import BatchStatus, Shard
from gateway.lines.reservation import batch_holds
from gateway.lines.stops import CANCELLED, EXPIRED, LOST, stop_reason
from gateway.lru import LRU
from gateway.pipeline.input_files import release_input
from gateway.pipeline.lifecycle import Announce, announce_nothing, derived_id, expiry
from gateway.pipeline.merge import advance_merge, merge_shards, merged_shards, seal_shard
from gateway.store.blobs.keys import batch_prefix, file_key, merge_checkpoint_key, order_key
from gateway.store.protocols import Blobs, Coordination, Store
from gateway.store.records import BatchFields, FileRecord, now, storage_team

log = logging.getLogger("batchyard.finalizer")

class Finalizer:
    def __init__(
        self, store: Store, blobs: Blobs, coordination: Coordination,
        reporter: Callable[[str], RouteReporter | None], *, announce: Announce = announce_nothing,
        file_expiry_seconds: int | None = None,
    ) -> None:
        # `reporter(route)`: the route's backend when it summarises routes for finalize (native batches), else
        # None. Only that hook, not the backends: finalizing never starts an engine or builds a Router.
        self.store, self.blobs, self._coordination, self._reporter = store, blobs, coordination, reporter
        self._announce = announce
        self._file_expiry = file_expiry_seconds  # outputs without output_expires_after expire after this
        self._shards: LRU[str, list[Shard]] = LRU(64)  # the running batches' shards, for `_advance`

    async def finish_shard(self, shard: Shard) -> None:
        """Mark a shard finished; finalize its batch if it was the last, else merge what is ready of it."""
        if await self.store.ledger.finish_shard(shard) == 0:
            await self.finalize(shard.batch_id)
        elif await self._advance(shard.batch_id) and not await self.store.ledger.unfinished_shards(shard.batch_id):
            # The last shard finished while this merge held the lease, so its finalize found it held and left:
            # finalizing is ours (the sweep would, later).
            await self.finalize(shard.batch_id)

    async def _advance(self, batch_id: str) -> bool:
        """Merge the batch's shards sealed so far, as far as the first one still open (`advance_merge`), so
        that a big batch's sealed results do not pile up until its last shard. False if another process held
        the lease (a merge or the finalize)."""
        async with self._coordination.lease(f"finalize:{batch_id}") as ours:
            if not ours:
                return False
            batch = await self.store.batches.get(batch_id)
            if batch is None or batch.status is not BatchStatus.IN_PROGRESS:
                return True
            shards = self._shards.get(batch_id)
            if shards is None:  # fixed once the batch runs (`put_shards` at the end of its plan)
                shards = await self.store.ledger.get_shards(batch_id)
                self._shards.put(batch_id, shards)
            output_id, error_id = self._outputs(batch_id, batch.options.split_errors)
            await advance_merge(self.blobs, shards, file_key(output_id), file_key(error_id) if error_id else None,
                                run_batch_errors=batch.options.run_batch_errors, index_key=order_key(batch_id),
                                checkpoint_key=merge_checkpoint_key(batch_id))
            return True

    @staticmethod
    def _outputs(batch_id: str, split_errors: bool) -> tuple[str, str | None]:
        """The ids of the batch's output file and error file (None: its errors go in the output)."""
        return derived_id("file", batch_id, "output"), derived_id("file", batch_id, "errors") if split_errors else None

    async def finalize(self, batch_id: str) -> None:
        async with self._coordination.lease(f"finalize:{batch_id}") as ours:
            if ours:
                with tracing.stage("batch.finalize", await self.store.batches.get(batch_id)
                                   if tracing.enabled() else None):
                    await self._finalize(batch_id)

    async def _finalize(self, batch_id: str) -> None:
        batch = await self.store.batches.get(batch_id)
        if batch is None or batch.status.finished:
            return
        reason = stop_reason(batch)
        if batch.status is BatchStatus.IN_PROGRESS and reason is None:
            await self.store.batches.update(batch_id, {"status": BatchStatus.FINALIZING, "finalizing_at": now()},
                                          if_status={BatchStatus.IN_PROGRESS})
        shards = await self.store.ledger.get_shards(batch_id)
        merged = await merged_shards(self.blobs, batch_id)  # by a finalizer that died mid-merge: results gone
        for shard in shards:
            if shard.index not in merged:
                await seal_shard(self.store, self.blobs, shard, missing=reason or LOST)
        output_id, error_id = self._outputs(batch_id, batch.options.split_errors)
        summary, n_out, n_err = await merge_shards(
            self.blobs, shards, file_key(output_id), file_key(error_id) if error_id else None,
            run_batch_errors=batch.options.run_batch_errors, index_key=order_key(batch_id),
            checkpoint_key=merge_checkpoint_key(batch_id),
        )
        created = now()
        expires_at = expiry(batch.output_expires_after, created, "output_expires_after")
        if expires_at is None and self._file_expiry is not None:
            expires_at = created + self._file_expiry
        routes = dict(batch.routes)
        for name, stats in (await self.store.ledger.route_stats(batch_id)).items():
            if name:
                routes[name] = {**routes.get(name, {}), **stats.to_json(), "reruns": summary.reruns[name],
                                "output_invalid": summary.output_invalid[name]}
        reporters = self._reporters(shards)
        for name, reporter in reporters.items():
            routes[name] = {**routes.get(name, {}), **await reporter.route_summary(batch_id, name)}
        fields: BatchFields = {"routes": routes, "summary": summary.to_json()}
        for file_id, count, what in ((output_id, n_out, "output"), (error_id, n_err, "error")):
            if file_id is None:
                continue
            key = file_key(file_id)
            if count == 0 and (what == "error" or batch.options.split_errors):
                await self.blobs.delete(key)
                continue
            size = await self.blobs.size(key) or 0
            await self.store.files.put(FileRecord(file_id, batch.files_owner, size, created, f"{batch_id}_{what}.jsonl",
                                                 "batch_output", expires_at, key))
            # Counted against the team's storage as its uploads are (never refused: the run is done; the next
            # upload or create is): a finalizer run again writes the same entry.
            await self.store.storage.settle(storage_team(batch.owner), file_id, size)
            if what == "output":
                fields["output_file_id"] = file_id
            else:
                fields["error_file_id"] = file_id
        if reason is CANCELLED:
            fields.update({"status": BatchStatus.CANCELLED, "cancelled_at": now()})
        elif reason is EXPIRED:
            fields.update({"status": BatchStatus.EXPIRED, "expired_at": batch.expired_at or now()})
        else:
            fields.update({"status": BatchStatus.COMPLETED, "completed_at": now()})
        # Before the status (a finished batch's spend is whole) and after every shard is sealed above (no result
        # counts after its seal, so nothing more is owed: the settle may forget the batch's moves).
        await self.store.ledger.settle_spend(batch_id)
        # Whatever the batch still holds of its team's budget goes (its jobs' results are in the spend, or never
        # will be: cancelled, failed, or a worker that died holding it).
        await self.store.quota.unreserve(batch.owner, batch_holds(batch_id))
        await self._announce(batch.owner, batch_id, fields["status"])
        tracing.status_event(fields["status"], completed=summary.succeeded, failed=summary.failed)
        await self.store.batches.update(batch_id, fields)
        await self.store.ledger.drop_log(batch_id)  # after the update: a reader that saw it running still finds it
        await self.blobs.delete_prefix(batch_prefix(batch_id))
        await release_input(self.store, self.blobs, batch)  # the input, when its file was deleted as it ran
        for reporter in reporters.values():  # after the record holds the summary: a re-run still finds the state
            await reporter.forget_batch(batch_id)

    def _reporters(self, shards: list[Shard]) -> dict[str, RouteReporter]:
        found: dict[str, RouteReporter] = {}
        for route in sorted({s.route for s in shards if s.route}):
            if (reporter := self._reporter(route)) is not None:
                found[route] = reporter
        return found


__all__ = ["Finalizer"]
