"""The runtime: the parts, composed over one `Store`, `Blobs`, `Queue` and `Coordination`.

- `service` (`BatchService`): files and batches; validation into shards.
- `runner` (`ShardRunner`): runs the shards of the routes this process hosts
  (None in a process that hosts none, like the API process with workers).
- `finalizer` (`Finalizer`): merges a finished batch into its output files.
- `sweeper` (`Sweeper`): heartbeats, expiry, and recovery.
- `webhooks` (`WebhookSender`): the teams' batch webhooks, recorded in `store.webhooks`
  before a batch ends and sent by the process that sweeps (one at a time).
- `logins` (`Logins`), `idempotent_creates` (`IdempotentCreates`): what the API keeps about its callers
  between requests (the dashboard's sessions, the creates' `Idempotency-Key`s), in `store.sessions` and
  `store.idempotency`.

`open_embedded` hands the parts SQLite, a local directory and the SQLite queue
(one machine, any number of processes); `open_shared` hands them Redis, S3 and
Redis Streams (many machines). Nothing else differs between the modes.

With `validation_processes` (what `batchyard serve` asks for) the service plans
new batches in that many processes of their own (`ValidationProcesses`), which
open the same blobs from their `BlobPlace`: a large upload's validation never
stalls the API's event loop. Without (`batchyard run`, the workers) it plans in
place, in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Collection, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import metrics
from gateway.backends.interface import ROUTE_UNAVAILABLE, BackendUnavailable
from gateway.callers.idempotent_creates import IdempotentCreates
from gateway.callers.logins import Logins
from gateway.config.schema import Config
from gateway.lines.budget import Budgets
from gateway.pipeline.batch_service import BatchService
from gateway.pipeline.finalizer import Finalizer
from gateway.pipeline.shard_runner import ShardRunner
from gateway.pipeline.sweeper import Sweeper
from gateway.runtime.create_estimates import CreateEstimates
from gateway.runtime.pool import BackendPool
from gateway.runtime.validation_processes import ValidationProcesses
from gateway.store.blobs.place import S3_ENDPOINT_ENV, BlobPlace
from gateway.store.faults import machine_fault, once_a_minute
from gateway.store.protocols import Blobs, Coordination, Queue, Store
from gateway.webhooks.crossings import budget_alerts
from gateway.webhooks.sender import WebhookSender
from gateway.webhooks.targets import retry_schedule, webhook_targets

if TYPE_CHECKING:
    from gateway.runtime.supervisor import Supervisor
    from gateway.store.sqlite.queue import SQLiteQueue

log = logging.getLogger("batchyard.runtime")

DB_NAME = "batchyard.sqlite3"


def weights_of(config: Config) -> dict[str, float]:
    """team -> weight, for the queue's fair pick."""
    return {team.team_id: team.weight for team in config.batch.teams}


def worker_name() -> str:
    """This process's name as a worker: unique on the machine and across machines."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Runtime:
    def __init__(
        self, config: Config, store: Store, blobs: Blobs, queue: Queue, coordination: Coordination, *,
        mode: str, name: str, routes: Collection[str] | None, heartbeat: float, sweep_every: float,
        sweeping: bool = True, recover_at_start: bool = False, embedded: tuple[Path, SQLiteQueue] | None = None,
        validation: ValidationProcesses | None = None,
    ) -> None:
        """`routes`: the routes whose shards this process runs (None: every route; empty: none).
        `embedded`: the data directory and its queue, in the embedded mode (for `worker_pool`).
        `validation`: the processes that plan new batches (None: this process plans them)."""
        self.config, self.store, self.blobs, self.queue, self.coordination = config, store, blobs, queue, coordination
        self._embedded = embedded
        self.mode, self.name = mode, name
        self._tasks: set[asyncio.Task[Any]] = set()
        self.validation = validation
        self.backends = BackendPool(config, store, coordination, worker=name)
        metrics.label_routes_by(config.metric_route)  # a wildcard's models count under its pattern
        self.quotas = store.quota
        self.budgets = Budgets(config, self.quotas)
        targets = webhook_targets(config)
        self.webhooks = WebhookSender(store.webhooks, store.batches, coordination, targets, spawn=self.spawn,
                                      policy=retry_schedule(config),
                                      before_pass=budget_alerts(config, self.budgets, store.webhooks, targets))
        announce = self.webhooks.announce
        self.finalizer = Finalizer(store, blobs, coordination, self.backends.reporter, announce=announce,
                                   file_expiry_seconds=config.batch.file_expiry_seconds)
        estimates = CreateEstimates(config, blobs, validation, self.budgets.reserves_at_create, self.spawn)
        # The stages before the finalizer are handed its `finish_shard`; the sweeper, after it, holds it.
        self.service = BatchService(config, store, blobs, queue, coordination, spawn=self.spawn,
                                    finish_shard=self.finalizer.finish_shard, announce=announce,
                                    budgets=self.budgets, plan=validation.plan if validation else None,
                                    estimate_cost=estimates.cost, file_stored=estimates.file_stored)
        every = sorted({r.model_name for r in config.routes.values()})
        hosted = every if routes is None else sorted(r for r in routes if r)
        self.runner = (ShardRunner(config, store, blobs, queue, self.backends,
                                   finish_shard=self.finalizer.finish_shard, routes=hosted, spawn=self.spawn,
                                   budgets=self.budgets)
                       if hosted else None)
        self.sweeper = Sweeper(store, queue, coordination, self.service, self.finalizer, name=name,
                                       routes=hosted, spawn=self.spawn, heartbeat=heartbeat, sweep_every=sweep_every,
                                       unavailable=lambda: self.backends.unavailable, pacing=self.backends.pacing)
        # What the API asks about its callers: it writes neither part itself.
        self.logins = Logins(store.sessions)
        self.idempotent_creates = IdempotentCreates(store.idempotency)
        self._sweeping = sweeping
        self._recover_at_start = recover_at_start
        # What the operator should fix but need not (a shared Redis without persistence): said at start, and
        # on /health to the admin
        self.warnings: list[str] = []

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def hosted(self) -> list[str]:
        return sorted(self.runner.routes or ()) if self.runner is not None else []

    async def start(self) -> None:
        """Start the backends this process hosts (engines load, LiteLLM is imported) before taking a shard,
        then the loops. A slow engine start must not hold a claimed shard."""
        if self.validation is not None:
            self.validation.start()
        if self.runner is not None:
            await self.backends.warm_up(self.hosted)
            for route in self.hosted:
                try:
                    await self.backends.get(route)
                except BackendUnavailable as exc:  # this route stops alone; every other one runs
                    log.error("route %r cannot run: %s; its lines get %r errors", route, exc, ROUTE_UNAVAILABLE)
            await self._unless_machine_fault(self.sweeper.beat())
        if self._recover_at_start:
            await self._unless_machine_fault(self.sweeper.sweep(stale_after=0))
        self.sweeper.start(hosting=self.runner is not None, sweeping=self._sweeping)
        if self._sweeping and any(t.webhook_url for t in self.config.batch.teams):
            self.webhooks.start()
        if self.runner is not None:
            self.spawn(self.runner.loop(), "runner")

    async def _unless_machine_fault(self, step: Awaitable[Any]) -> None:
        """A first beat or sweep that meets a full disk or a store down: said, and left to the loops that do
        it again (the runner pauses until the fault clears), not a process that exits with a traceback."""
        try:
            await step
        except Exception as exc:
            fault = machine_fault(exc)
            if fault is None:
                raise
            if once_a_minute(fault.kind):
                log.warning("%s unavailable (%s: %s); starting anyway, the loops retry", fault.service,
                            fault.words, fault.detail)

    def worker_pool(
        self, count: int, *, config_path: str, upstream_only: bool = False, verbose: bool = False,
        on_config_error: Callable[[str], None] | None = None,
    ) -> Supervisor:
        """`count` worker processes over this runtime's data directory, which hand the shards of one that
        dies back to the queue at once. The embedded mode only: shared-mode workers are `batchyard worker`s."""
        from gateway.runtime.supervisor import Supervisor

        if self._embedded is None:
            raise RuntimeError("worker processes belong to the embedded mode")
        data_dir, queue = self._embedded
        return Supervisor(count, data_dir, queue, config_path=config_path, upstream_only=upstream_only,
                          verbose=verbose, on_config_error=on_config_error)

    async def health(self) -> dict[str, Any]:
        info = await self.sweeper.health(self.mode)
        return {**info, "warnings": list(self.warnings)} if self.warnings else info

    async def aclose(self) -> None:
        if self.runner is not None:
            self.runner.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.validation is not None:
            await self.validation.aclose()
        await self.sweeper.stop(hosting=self.runner is not None)
        await self.backends.aclose()
        await self.webhooks.aclose()
        await self.queue.aclose()
        await self.coordination.aclose()
        await self.blobs.aclose()
        await self.store.aclose()


async def open_embedded(
    config: Config, data_dir: Path, *, routes: Collection[str] | None = None, owner: bool = True,
    sweeping: bool | None = None, validation_processes: int = 0,
) -> Runtime:
    """The embedded mode: SQLite records, queue and leases, a local blob directory, in `data_dir`.

    `owner`: this process owns the directory (the API process or `batchyard run`): at start it forgets
    the leases and heartbeats a killed predecessor left, and recovers its batches at once. Worker
    processes it starts are not owners. `validation_processes`: plan new batches in that many processes
    of their own (0: in this one).
    """
    from gateway.store.sqlite.coordination import SQLiteCoordination
    from gateway.store.sqlite.queue import SQLiteQueue
    from gateway.store.sqlite.store import SQLiteStore

    data_dir.mkdir(parents=True, exist_ok=True)
    db = data_dir / DB_NAME
    name = worker_name()
    store = SQLiteStore(db, rate_window_seconds=config.batch.rate_window_seconds)
    coordination = SQLiteCoordination(db, holder=name)
    if owner:
        await coordination.reset()
    queue = SQLiteQueue(db, consumer=name, weights=weights_of(config), lane=config.lane)
    place = BlobPlace.of(data_dir / "blobs")
    return Runtime(config, store, place.open(), queue, coordination,
                   mode="embedded", name=name, routes=routes, heartbeat=1.0, sweep_every=1.0,
                   sweeping=owner if sweeping is None else sweeping, recover_at_start=owner,
                   embedded=(data_dir, queue),
                   validation=ValidationProcesses(config, place, validation_processes) if validation_processes
                   else None)


async def open_shared(
    config: Config, redis_url: str, blob_location: str | Path, *, routes: Collection[str] | None = (),
    claim_idle: float | None = None, name: str | None = None, prefix: str | None = None,
    s3_endpoint_url: str | None = None, validation_processes: int = 0, redis_ca_file: str | None = None,
    allow_evicting_redis: bool = False,
) -> Runtime:
    """The shared mode: the store on Redis at `redis_url`, the blobs at `blob_location` (the CLI's `--blobs`:
    `s3://bucket/prefix` or a directory every process can reach). `routes`: the routes this process runs
    shards for (`()`: none, an API replica; `None`: every route of the config). `validation_processes`: as
    `open_embedded`'s. `redis_ca_file`: the CA of a `rediss://` Redis (default: the system's). A Redis that may
    evict keys raises `EvictingRedis` (a `ConfigError`) unless `allow_evicting_redis`."""
    from gateway.store.redis.connection import API_RETRIES, WORKER_RETRIES, open_redis
    from gateway.store.redis.coordination import RedisCoordination
    from gateway.store.redis.migration import migrate_layout
    from gateway.store.redis.preflight import check_server
    from gateway.store.redis.queue import DEFAULT_CLAIM_IDLE, RedisStreamQueue
    from gateway.store.redis.store import RedisStore

    idle = DEFAULT_CLAIM_IDLE if claim_idle is None else claim_idle
    if not idle > 0:
        raise ValueError(f"claim_idle must be a positive number of seconds, not {claim_idle}")  # 0: every shard lost
    # An API replica (no routes) answers 503 soon when Redis is gone; a process that runs shards waits longer
    # one server or a cluster (its keys in one hash slot); fails fast on a wrong URL
    client, keys = await open_redis(redis_url, API_RETRIES if routes is not None and not routes else WORKER_RETRIES,
                                    ca_file=redis_ca_file, prefix=prefix)
    try:
        warnings = await check_server(client, keys, allow_evicting=allow_evicting_redis)
    except BaseException:
        await client.aclose()
        raise
    try:
        await migrate_layout(client, keys)  # a Redis the previous version wrote: its keys into their hash slots
    except BaseException:
        await client.aclose()
        raise
    name = name or worker_name()
    every = sorted({route.model_name for route in config.routes.values()})
    queue = RedisStreamQueue(client, every, keys=keys, consumer=name, claim_idle=idle, weights=weights_of(config),
                             lane=config.lane)
    store = RedisStore(client, keys, owns_client=True, rate_window_seconds=config.batch.rate_window_seconds)
    place = BlobPlace.of(blob_location, endpoint_url=s3_endpoint_url)
    # A worker's heartbeat lives as long as its shards may stay idle: a shard is taken over only
    # when both have run out.
    runtime = Runtime(config, store, place.open(), queue,
                      RedisCoordination(client, keys, name), mode="shared", name=name, routes=routes,
                      heartbeat=idle / 3, sweep_every=5.0,
                      validation=ValidationProcesses(config, place, validation_processes) if validation_processes
                      else None)
    runtime.warnings = warnings
    return runtime


__all__ = ["S3_ENDPOINT_ENV", "Runtime", "open_embedded", "open_shared", "worker_name"]
