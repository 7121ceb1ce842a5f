"""The sweeper (`Sweeper`): heartbeats, expiry, and picking up what dead processes left.

One recovery path for both modes. The sweep (one process at a time, under the
`sweep` lease) looks at every unfinished batch:
- past its `expires_at`: marked expired (running shards stop, unrun lines get
  `batch_expired`);
- left in `validating` by a process that died (no validate lease held, older
  than `stale_validation` seconds): validated again;
- unfinished shards that no queue entry carries (a process died while
  enqueueing, or Redis lost writes): enqueued again;
- every shard finished but not finalized (a worker died finalizing): finalized;
- index entries of a batch or file whose create stopped before its record (the shared store's), once
  their create is older than its grace (`gateway.store.redis.creates`): removed.
A dead worker's held shards need nothing here: the queue delivers them again
once the worker's heartbeat is gone. At start-up the embedded owner runs one
sweep at once with no staleness wait: that is the recovery after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from typing import Any

from gateway.domain import BatchStatus
from gateway.lines.budget import hold_made_at
from gateway.lines.reservation import batch_holds
from gateway.log_safe import escaped
from gateway.pipeline.batch_service import BatchService
from gateway.pipeline.finalizer import Finalizer
from gateway.pipeline.lifecycle import for_queue
from gateway.pipeline.uploads import Uploads
from gateway.store.faults import forget, machine_fault, notice, noticed, once_a_minute
from gateway.store.protocols import Coordination, Queue, Store
from gateway.store.quota import GRACE_SECONDS
from gateway.store.records import BatchRecord, now

log = logging.getLogger("batchyard.coordinator")  # the logger keeps its name: operators filter on it

STALE_VALIDATION_SECONDS = 10  # a batch validating this long with no lease held was left by a dead process
_FILE_SWEEP_SECONDS = 5.0  # a cheap indexed query; expired files should not linger


class Sweeper:
    def __init__(
        self, store: Store, queue: Queue, coordination: Coordination, intake: BatchService, finalizer: Finalizer,
        *, name: str, routes: Collection[str], spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        heartbeat: float, sweep_every: float, unavailable: Callable[[], Mapping[str, str]] = dict,
        pacing: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        # The sweep hands a batch back to the stage that owns it: `validating` to the intake, finished
        # shards to the finalizer (both earlier stages, called directly).
        self.store, self.queue, self.coordination = store, queue, coordination
        self.intake, self.finalizer = intake, finalizer
        self.name, self.routes = name, sorted(routes)
        self._spawn = spawn
        self._heartbeat, self._sweep_every = heartbeat, sweep_every
        self._started_at = now()
        self._noticed: set[str] = set()  # the faults of the machine its loops met (the dashboard says them)
        self._files_swept_at = 0.0
        self._unavailable = unavailable  # route -> why it cannot start here, told in each heartbeat
        self._pacing = pacing  # background route -> its pacing here (`providers.background`), in each heartbeat
        self._told: set[tuple[str, str]] = set()  # unavailable routes this process has logged, once each

    # -- the loops -----------------------------------------------------------------

    async def beat(self) -> None:
        info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "routes": self.routes,
                "started_at": self._started_at, "seen_at": now(), "unavailable": dict(self._unavailable()),
                "paused": noticed(),  # the faults of the machine it waits on (the dashboard says which)
                "background": dict(self._pacing())}
        await self.coordination.beat(self.name, info, ttl=self._heartbeat * 3)

    def start(self, *, hosting: bool, sweeping: bool) -> None:
        if hosting:
            self._spawn(self._every(self._heartbeat, self.beat), "heartbeat")
        if sweeping:
            self._spawn(self._every(self._sweep_every, self.sweep), "sweeper")

    async def _every(self, seconds: float, step: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step()
                if self._noticed:  # the store answers again: what this loop met is over
                    forget(self._noticed)
                    self._noticed.clear()
            except Exception as exc:
                fault = machine_fault(exc)
                if fault is None:
                    log.warning("%s failed: %s", getattr(step, "__name__", step), escaped(exc))
                    continue
                notice(fault.kind)  # for the dashboard: "waiting: disk full since 10:02"
                self._noticed.add(fault.kind)
                if once_a_minute(fault.kind):  # the runner says it too: one line a minute is enough
                    log.warning("%s unavailable (%s: %s); %s waits", fault.service, fault.words, fault.detail,
                                getattr(step, "__name__", step))

    async def stop(self, hosting: bool) -> None:
        if hosting:
            with contextlib.suppress(Exception):
                await self.coordination.gone(self.name)

    # -- the sweep ---------------------------------------------------------------------

    async def sweep(self, *, stale_after: float = STALE_VALIDATION_SECONDS) -> None:
        """Pick up what dead processes left (see the module docs). One process at a time."""
        if not await self.coordination.acquire("sweep", max(self._sweep_every * 2, 5.0)):
            return
        try:
            queued = set(await self.queue.queued())  # read before the shards: see put_missing
            active = await self.store.batches.active()
            for batch in active:
                await self._sweep_batch(batch, queued, stale_after)
            await self._release_quotas({b.id for b in active})
            await self._release_holds({b.id for b in active})
            workers = await self.coordination.live_workers()
            self._tell_unavailable(workers)
            await self.queue.tidy({w["name"] for w in workers})
            if time.monotonic() - self._files_swept_at > _FILE_SWEEP_SECONDS:
                self._files_swept_at = time.monotonic()
                # index entries of creates that stopped before their record, once past their grace
                if left := await self.store.batches.tidy(time.time()) + await self.store.files.tidy(time.time()):
                    log.info("removed the index entries of %d create(s) that stopped half way", left)
                if gone := await self.intake.delete_expired_files():
                    log.info("deleted %d expired file(s)", gone)
                if expired := await Uploads(self.intake).sweep():
                    log.info("expired %d upload(s) and removed their parts", expired)
        finally:
            await self.coordination.release("sweep")

    def _tell_unavailable(self, workers: list[dict[str, Any]]) -> None:
        """Log, once, each route a worker cannot run and why: the sweeping process (the API's, in embedded
        mode) says it, not only the worker's own log."""
        for worker in workers:
            for route, reason in worker.get("unavailable", {}).items():
                if (route, reason) not in self._told:
                    self._told.add((route, reason))
                    log.error("route %r is unavailable on worker %s (pid %s): %s; its lines fail with "
                              "model_unavailable", route, worker["name"], worker.get("pid"), reason)

    async def _sweep_batch(self, batch: BatchRecord, queued: set[str], stale_after: float) -> None:
        t = now()
        if batch.expired_at is None and t >= batch.expires_at and batch.status is not BatchStatus.CANCELLING:
            await self.store.batches.update(batch.id, {"expired_at": t})
            if batch.status is BatchStatus.VALIDATING:
                await self.intake.expire(batch)
                return
        if await self.coordination.held(f"validate:{batch.id}"):
            return  # being validated or enqueued right now
        if batch.status is BatchStatus.VALIDATING or (batch.status is BatchStatus.CANCELLING
                                                      and batch.shards_total == 0):
            if t - batch.created_at >= stale_after:
                if batch.status is BatchStatus.VALIDATING:
                    log.warning("batch %s was left validating; validating it again", batch.id)
                self._spawn(self.intake.validate(batch.id), f"validate-{batch.id}")
            return
        unfinished = await self.store.ledger.unfinished_shards(batch.id)
        if not unfinished:
            if not await self.coordination.held(f"finalize:{batch.id}"):
                self._spawn(self.finalizer.finalize(batch.id), f"finalize-{batch.id}")
            return
        for shard in unfinished:
            if shard.key in queued:
                continue
            if not shard.route:  # the shard of lines answered at validation: sealed already
                await self.finalizer.finish_shard(shard)
            elif await self.queue.put_missing(for_queue(shard, batch)):
                log.warning("shard %s was in no queue; enqueued it again", shard.key)

    async def _release_quotas(self, active: set[str]) -> None:
        """Finished batches free their quota places, however they ended (and so do admissions whose batch
        was never stored, once their creation cannot be under way any more)."""
        done = []
        for batch_id, admitted_at in (await self.store.quota.admitted()).items():
            if batch_id in active:
                continue
            batch = await self.store.batches.get(batch_id)
            if (batch.status.finished if batch is not None else time.time() - admitted_at > GRACE_SECONDS):
                done.append(batch_id)
        if done:
            await self.store.quota.release(done)

    async def _release_holds(self, active: set[str]) -> None:
        """What a batch holds of its team's budget goes once the batch has ended, however it ended (a worker
        that died holding it included), and so does a create's hold whose batch was never stored, once its
        creation cannot be under way any more."""
        for team in self.intake.budgets.teams_with_budgets():
            for holder in await self.store.quota.reserved(team):
                batch_id = holder.partition("/")[0]
                if batch_id in active:
                    continue
                batch = await self.store.batches.get(batch_id)
                if batch is None:
                    made = hold_made_at(holder)  # None: a provider job's hold, its batch gone
                    if made is not None and time.time() - made <= GRACE_SECONDS:
                        continue
                elif not batch.status.finished:
                    continue
                await self.store.quota.unreserve(team, batch_holds(batch_id))

    # -- health ------------------------------------------------------------------------

    async def health(self, mode: str) -> dict[str, Any]:
        waiting, in_flight = await self.queue.counts()
        workers = await self.coordination.live_workers()
        served = {r for w in workers for r in w["routes"]}
        return {
            "mode": mode,
            "queue_depth": waiting,
            "in_flight": in_flight,
            "workers": [{"name": w["name"], "host": w["host"], "pid": w["pid"], "routes": w["routes"],
                         "seen_at": w["seen_at"], "unavailable": w.get("unavailable", {})} for w in workers],
            "unserved_routes": sorted(r for r in waiting if r not in served),
            "unavailable_routes": unavailable_routes(workers),
            "background_routes": background_routes(workers),
        }


def background_routes(workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """route -> its pacing over the live workers (from their heartbeats): the allowed concurrency (the route's,
    shared), requests in flight (summed), the server's waiting count as last read, and what to know."""
    routes: dict[str, dict[str, Any]] = {}
    for worker in workers:
        for route, state in (worker.get("background") or {}).items():
            seen = routes.setdefault(route, {"allowed": 0, "in_flight": 0, "server_waiting": None,
                                             "metrics_up": True, "notice": None})
            seen["allowed"] = max(seen["allowed"], int(state.get("allowed") or 0))
            seen["in_flight"] += int(state.get("in_flight") or 0)
            if state.get("server_waiting") is not None:
                seen["server_waiting"] = max(seen["server_waiting"] or 0, int(state["server_waiting"]))
            seen["metrics_up"] = seen["metrics_up"] and state.get("metrics_up") is not False
            seen["notice"] = seen["notice"] or state.get("notice")
    return routes


def unavailable_routes(workers: list[dict[str, Any]]) -> dict[str, str]:
    """route -> why, for each route some live worker cannot run (from their heartbeats)."""
    return {route: reason for w in workers for route, reason in w.get("unavailable", {}).items()}


__all__ = ["STALE_VALIDATION_SECONDS", "Sweeper", "background_routes", "unavailable_routes"]
