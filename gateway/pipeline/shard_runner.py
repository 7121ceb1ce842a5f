"""The shard runner: claims shards from the `Queue`, runs them on a `Backend`,
journals their results in the `Store`, and hands finished shards to the finalizer.

Fair share (`gateway.scheduling.fairness`): a process runs `max_shards_in_flight` shards;
past that it still takes a shard of a batch it has none of (a sooner deadline
must not wait for a later batch's shards to end), up to twice the limit, and
past that a shard of a team it has none of (a newcomer never waits behind
another team's long shards). The queue picks which shard by fair share, and
the requests of every shard here go through the backend's `FairSlots` as their
team's, so that a shard taken in overflow gets its share at once.

A shard's attempts are counted in the store, by whichever process claims it,
so a shard that kills every worker it reaches (or fails in every one) is given
up after `MAX_ATTEMPTS`: its unfinished lines get `shard_failed` error results
and the batch finishes. Only faults of the work spend attempts: a fault of the machine (a full disk, the
store or S3 down: `gateway.store.faults`) gives its attempt back, hands the shard back and pauses the
runner, with a back-off, until a shard runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any

from gateway import metrics, tracing
from gateway.backends.interface import ROUTE_UNAVAILABLE, Backends, BackendUnavailable, ShardAwareBackend
from gateway.config.prices import Prices, route_prices
from gateway.config.routes import RouteKind
from gateway.config.schema import Config
from gateway.domain import BatchRequest, Result, Shard, billable
from gateway.lines.budget import Budgets, TeamSpending, create_hold, spending_for
from gateway.lines.stops import GIVEN_UP, LOST, MAX_ATTEMPTS, OVER_BUDGET, StopReason, stop_reason
from gateway.pipeline.merge import ResultsLost, seal_shard
from gateway.pipeline.output_reruns import OutputReruns
from gateway.pipeline.shard_input import read_requests
from gateway.scheduling.fairness import DEFAULT_WEIGHT, Share, running_for, stop_sending
from gateway.scheduling.pacing import Pacer, pacing_with
from gateway.store.blobs.keys import shard_results_key
from gateway.store.faults import Pause, machine_fault
from gateway.store.protocols import Blobs, Queue, Store
from gateway.store.records import BatchRecord, Delivery

log = logging.getLogger("batchyard.runner")

_FLUSH_EVERY = 64  # results per journal write
_FLUSH_SECONDS = 0.25
_POLL_SECONDS = 0.5  # how often a running shard looks for cancel and expiry
_FULL_POLL = 0.25  # a full process looks this often for a newcomer team's shard


def _fault_kind(exc: Exception) -> str | None:
    fault = machine_fault(exc)
    return fault.kind if fault is not None else None


def price(prices: Prices | None, result: Result) -> None:
    """Give a result the route's prices when its backend did not price it (local routes)."""
    if prices is None or result.cost_usd is not None or not result.ok:
        return
    result.cost_usd = prices.cost(result.usage)


class ShardRunner:
    def __init__(
        self, config: Config, store: Store, blobs: Blobs, queue: Queue, backends: Backends,
        *, finish_shard: Callable[[Shard], Awaitable[None]], routes: Collection[str] | None,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]], budgets: Budgets | None = None,
    ) -> None:
        # `finish_shard`: the finalizer's, handed in (a later stage; the runner does not import it).
        self.config, self.store, self.blobs, self.queue = config, store, blobs, queue
        self.backends, self._finish_shard = backends, finish_shard
        self.routes = set(routes) if routes is not None else None  # None: every route
        self._spawn = spawn
        self._running: dict[str, asyncio.Task[Any]] = {}  # delivery token -> the task running it
        self._closing = False
        self.weights = {t.team_id: t.weight for t in config.batch.teams}
        self._teams = {t.team_id: t for t in config.batch.teams}
        self.budgets = budgets or Budgets(config, None)
        self.pause = Pause(count=metrics.observe_machine_fault, show=metrics.set_paused)
        self._owed: dict[str, Shard] = {}  # attempts to give back that the store could not take yet
        queue.on_lost = self._lost

    async def loop(self) -> None:
        limit = self.config.batch.max_shards_in_flight
        teams: Counter[str] = Counter()  # team -> shards this process runs
        batches: Counter[str] = Counter()  # batch -> shards this process runs

        def done(shard: Shard) -> None:
            for count, key in ((teams, shard.team), (batches, shard.batch_id)):
                count[key] -= 1
                if count[key] <= 0:
                    del count[key]

        while not self._closing:
            await self.pause.wait()
            if self._owed and not await self._settle_owed():
                continue
            running = teams.total()
            skip_teams: Collection[str] = ()
            skip_batches: Collection[str] = ()
            if running >= 2 * limit:
                skip_teams = set(teams)  # only a team with no shard here: bounded by the number of teams
            elif running >= limit:
                skip_batches = set(batches)  # a batch with none here (a sooner deadline, EDF): up to 2x the limit
            try:
                # Full: the short timeout, so that a slot freed meanwhile soon takes any shard again.
                delivery = await self.queue.get(self.routes, timeout=_FULL_POLL if running >= limit else 1.0,
                                                skip_teams=skip_teams, skip_batches=skip_batches)
            except Exception as exc:
                fault = machine_fault(exc)
                if fault is None:
                    log.exception("queue read failed; retrying")
                    await asyncio.sleep(1.0)
                else:
                    self.pause.fault(fault)
                continue
            if delivery is None:
                continue
            shard = delivery.shard
            teams[shard.team] += 1
            batches[shard.batch_id] += 1
            task = self._spawn(self._process(delivery), f"shard-{shard.key}")
            task.add_done_callback(lambda _t, shard=shard: done(shard))  # type: ignore[misc]

    def close(self) -> None:
        self._closing = True

    async def _process(self, delivery: Delivery) -> None:
        shard = delivery.shard
        task = asyncio.current_task()
        assert task is not None
        self._running[delivery.token] = task
        started = time.monotonic()
        counted = False
        try:
            attempts = await self.store.ledger.begin_attempt(shard)
            counted = True
            if attempts > MAX_ATTEMPTS:
                log.error("shard %s: giving up after %d attempts", shard.key, attempts - 1)
                await seal_shard(self.store, self.blobs, shard, missing=GIVEN_UP)
                await self._finish_shard(shard)
            else:
                await self.run_shard(shard, attempts)
            await self.queue.ack(delivery)
            self.pause.succeeded(started)
        except asyncio.CancelledError:
            if self._running.get(delivery.token) is not None and not self._closing:
                raise
            # closing (the queue hands it back) or taken over by another worker: it runs the rest
        except Exception as exc:
            fault = machine_fault(exc)
            if isinstance(exc, ResultsLost):  # the store's loss, recovered by running the shard again
                log.warning("%s (lost by the store); handing it back to run again", exc)
            elif fault is None:
                log.exception("shard %s failed; handing it back", shard.key)
            else:  # the machine's fault, not the work's: one line a minute (Pause), the attempt given back
                self.pause.fault(fault)
                if counted:
                    self._owed[shard.key] = shard
                    await self._settle_owed()
            await self._hand_back(delivery)
        finally:
            self._running.pop(delivery.token, None)

    async def _hand_back(self, delivery: Delivery) -> None:
        """Give a shard back to the queue, trying again while the store cannot take it (a fault of the machine,
        after the runner's back-off): a shard left claimed by a live worker is never taken over, so a hand-back
        dropped on a full disk left its batch `in_progress` for good."""
        delay = 1.0
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                await self.queue.hand_back(delivery)
                return
            except Exception as exc:
                fault = machine_fault(exc)
                if fault is None:
                    log.exception("shard %s: could not hand it back", delivery.shard.key)
                    return
                delay = self.pause.fault(fault)  # the runner's own back-off, and its one log line a minute

    async def _settle_owed(self) -> bool:
        """Give back the attempts that faults of the machine took; False while the store cannot take them."""
        for key, shard in list(self._owed.items()):
            try:
                await self.store.ledger.return_attempt(shard)
            except Exception as exc:
                fault = machine_fault(exc)
                if fault is None:
                    log.exception("shard %s: could not give its attempt back", key)
                    self._owed.pop(key, None)
                else:
                    self.pause.fault(fault)
                return False
            self._owed.pop(key, None)
        return True

    def _lost(self, token: str) -> None:
        task = self._running.pop(token, None)
        if task is not None:
            task.cancel()

    async def run_shard(self, shard: Shard, attempt: int | None = None) -> None:
        """Run a shard's unfinished requests, seal it, and finalize the batch if it was the last."""
        if await self.blobs.size(shard_results_key(shard)) is not None:
            # Sealed before a crash: only the bookkeeping is left. (Sealed and merged already, a worker taken for
            # dead that claims it again: `read_requests` says so in `_run`, from the merge's checkpoint.)
            await self._finish_shard(shard)
            return
        batch = await self.store.batches.get(shard.batch_id)
        if batch is None:
            return
        with tracing.shard_span(shard, batch, attempt, fault=_fault_kind):  # the requests' spans are its children
            await self._run(shard, batch)

    async def _run(self, shard: Shard, batch: BatchRecord) -> None:
        reason = stop_reason(batch) or (OVER_BUDGET if await self.budgets.over(batch.owner) else None)
        requests: list[BatchRequest] | None = None
        if reason is None:
            requests = await read_requests(self.blobs, shard)  # from the input file (`shard_input`)
            if requests is None:  # sealed meanwhile by another (a worker taken for dead): only bookkeeping left
                await self._finish_shard(shard)
                return
            recorded = await self.store.ledger.recorded_lines(shard)
            todo = [r for r in requests if r.line not in recorded]
            if todo:
                share = Share(batch.owner, batch.id, batch.expires_at, self.weights.get(batch.owner, DEFAULT_WEIGHT))
                try:
                    hold = (create_hold(batch.id, batch.created_at) if self.budgets.reserves_at_create(batch.owner)
                            else None)
                    reason = await self._execute(shard, share, todo, hold, self._reruns(batch))
                except BackendUnavailable as exc:  # no attempt spent: the route's lines say why, once
                    reason = (ROUTE_UNAVAILABLE, f"The model {shard.route!r} is unavailable: {exc}")
                    await self._note_unavailable(shard.batch_id, shard.route, str(exc))
        if reason is None or reason is OVER_BUDGET or reason[0] == ROUTE_UNAVAILABLE:
            # the unrun lines get error lines now (over budget, or a route that cannot run)
            await seal_shard(self.store, self.blobs, shard, missing=reason, requests=requests)
        await self._finish_shard(shard)

    async def _note_unavailable(self, batch_id: str, route: str, why: str) -> None:
        """Keep why the route could not run with the batch (`routes[route]["unavailable"]`, kept by the
        finalizer, which starts after this shard's seal): the API and the dashboard say it after the worker
        that met it is gone, a restart included. Shards of two unavailable routes noting at once may keep one."""
        batch = await self.store.batches.get(batch_id)
        if batch is None:
            return
        facts = batch.routes.get(route, {})
        if facts.get("unavailable") != why:
            routes = {**batch.routes, route: {**facts, "unavailable": why}}
            await self.store.batches.update(batch_id, {"routes": routes})

    def _reruns(self, batch: BatchRecord) -> int | None:
        """How many more times a line whose reply does not match its schema runs: the batch's own
        (`run --output-reruns`), else its team's, else `batch_settings.output_check`; None: no check."""
        if batch.options.output_reruns is not None:  # asked for on the command line: checked whatever the config
            return batch.options.output_reruns
        team = self._teams.get(batch.owner)
        settings = (team.output_check if team is not None and team.output_check is not None
                    else self.config.batch.output_check)
        return settings.reruns if settings.enabled else None

    def _pacer(self, team: str, route: str) -> Pacer | None:
        """The team's rate limits on the route, counted in the store (None: the team has none there)."""
        settings = self._teams.get(team)
        rpm, tpm = settings.rate_limits(route) if settings is not None else (None, None)
        return None if rpm is None and tpm is None else Pacer(self.store.rates, team, route, rpm, tpm)

    async def _execute(self, shard: Shard, share: Share, todo: list[BatchRequest],
                       hold: str | None, reruns: int | None) -> StopReason | None:
        owner = share.team
        backend = await self.backends.get(shard.route)
        buffer: list[Result] = []
        flushed_at = time.monotonic()
        pacer = self._pacer(owner, shard.route)
        route = self.config.route(shard.route)  # priced once per shard: results come by the thousand
        # A native route's backend prices its lines at batch rates itself (its real-time price is not what the
        # provider bills), and a line it leaves unpriced has no price at all.
        prices = (route_prices(route.model_info.litellm_keys)
                  if route is not None and route.kind is not RouteKind.NATIVE else None)
        # Results are priced and counted against the budget where their slots are released (before the next
        # request starts), else as they reach `consume`.
        spending = TeamSpending(self.budgets, owner, hold, price=functools.partial(price, prices))
        checks = OutputReruns(todo if reruns is not None else (), reruns or 0)
        # One write at a time: a hold goes only once every result before it is written, and a round of re-runs
        # starts once every reply is checked.
        flushing = asyncio.Lock()

        async def flush() -> None:
            nonlocal buffer, flushed_at
            async with flushing:
                done: list[Result] = []
                if buffer:
                    done, buffer = buffer, []
                    if checks:  # off the event loop, in this process: the results are here
                        done = await asyncio.to_thread(checks.settle, done)
                await spending.journal(record(done))  # in the spend now: out of the holds
                if pacer is not None:
                    await pacer.flush()  # the tokens results reported, into the team's rate window
                flushed_at = time.monotonic()

        async def record(done: list[Result]) -> float:
            """Journal `done`; what it cost."""
            if not done:
                return 0.0
            # The spend moves with the journal, in one step of the store (see SpendTo).
            await self.store.ledger.record_results(shard, done, self.budgets.spend_to(owner))
            metrics.observe_results(owner, shard.route, done)
            return sum(billable(r.cost_usd) for r in done)

        if isinstance(backend, ShardAwareBackend):
            results = backend.execute_shard(shard, todo)
        else:
            results = backend.execute(todo)

        async def consume() -> None:
            source = results
            rounds = 0
            while True:
                async for result in source:
                    spending.buffered(result)  # priced (before the check: an attempt re-run is paid all the same)
                    buffer.append(result)
                    if len(buffer) >= _FLUSH_EVERY or time.monotonic() - flushed_at > _FLUSH_SECONDS:
                        await flush()
                if not checks:
                    return
                await flush()  # every reply so far checked: the lines to re-run are known
                again = checks.take()
                if not again:
                    return
                if await spending.over():  # a spent budget starts nothing more: the lines keep their last reply
                    async with flushing:
                        await spending.journal(record(checks.give_up(again)))
                    return
                rounds += 1
                # The same route, through its slots and the team's rates; a native route's as the round's own
                # follow-up job (or in real time when the batch's window leaves no time for one).
                source = (backend.execute_shard(shard, again, rounds) if isinstance(backend, ShardAwareBackend)
                          else backend.execute(again))

        # The task copies the context: the backend's slots see whose requests these are, under which rates, and
        # whose budget they spend (a native route reserves of it before each provider job).
        with running_for(share), pacing_with(pacer), spending_for(spending):
            consumer = asyncio.create_task(consume(), name=f"shard-{shard.key}")
        stopping: StopReason | None = None
        try:
            while True:
                finished, _ = await asyncio.wait({consumer}, timeout=_POLL_SECONDS)
                if finished:
                    consumer.result()  # a bug in a backend surfaces here
                    return stopping
                await flush()  # slow results still get recorded promptly
                if stopping is not None:
                    continue
                batch = await self.store.batches.get(shard.batch_id)
                reason = stop_reason(batch) if batch is not None else LOST
                if reason is not None:
                    return reason
                if await self.budgets.over(owner):
                    # Over budget: nothing more starts; the requests in flight finish and are recorded.
                    stopping = OVER_BUDGET
                    stop_sending(shard.batch_id)
        finally:
            if not consumer.done():
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
            elif not consumer.cancelled():
                # Ended by an error while this loop was leaving by another (both a store that went away in a
                # failover): the one raised here stands; reading this one keeps asyncio from logging it as
                # "never retrieved" at ERROR when the task is collected.
                consumer.exception()
            try:
                await flush()
            finally:
                spending.close()


__all__ = ["ShardRunner", "price"]
