"""The shared `Queue`: Redis Streams with one consumer group, a stream per batch and route.

- One stream per (route, team, batch), indexed per (route, team) by the batch's
  deadline; each (route, team) queue is a hash slot of its own, and each route's
  registry of its teams another (`gateway.store.redis.keys` has the layout,
  `gateway.store.redis.scripts` the scripts). A put, an ack, a refresh and a
  reclaim touch one slot each, so a Redis Cluster spreads the queues over its
  masters. A worker reads only the routes it hosts. Streams give what a queue
  of workers needs: a pending list per consumer, idle times, XCLAIM for take-over.
- A claim is the fair pick (`gateway.scheduling.fairness.pick`, the embedded
  queue's rule) between teams, and EDF within a team. Teams are in different
  slots, which one script cannot touch together, so a claim is four steps: (1) the registries of the routes asked,
  (2) one script per (route, team), all in one pipeline, giving that team's use
  and its waiting batches without reading any, (3) the pick in Python, (4) a
  read of the chosen stream that reads nothing if another worker emptied it
  meanwhile, then the next-best candidate (at most `_TRIES`). What is not
  atomic is the comparison across teams: it is made on a snapshot one round
  trip old. The rule still holds: a worker takes only a candidate whose key
  was the least when read (a race only lets it take one whose key was best a
  round trip ago, as if it had claimed a moment sooner), and a shard is still
  read by one worker only (XREADGROUP in the stream's slot). On a cluster the
  per-team scripts run at once rather than pipelined (its client pipelines no
  scripts). The cost: 3 round trips per claim (the registries, the candidates,
  the read), O(teams x k) commands (k: a team's earliest batches looked at),
  never O(shards queued).
- A put registers its team in the route's registry first (idempotent, its own
  slot), then enqueues in the team's slot: a team registered with nothing queued
  only reads as empty.
- Every worker is a consumer of the group `workers` under its own name; a
  shard read stays in the group's pending list until the worker acks it
  (XACK, then XDEL: a stream holds only unacked shards; an empty stream is
  removed with its index entries, and `put` makes it again with its group).
- A dead worker's pending shards are taken over once they have been idle for
  `claim_idle` seconds (default 30) and their consumer has no heartbeat
  (`Coordination.live_workers`, which `gateway.pipeline.sweeper` keeps with a
  TTL of `claim_idle`): XAUTOCLAIM's rule plus a liveness check. Per (route,
  team) slot a script lists the consumers of idle entries; only if there are
  any are the live workers read, and the dead ones passed to the script that
  claims, slot by slot, until one shard is taken. A Redis restart that leaves
  every entry idle for a moment does not hand live workers' shards around.
- A live worker never loses a long shard: every `claim_idle / 3` seconds it
  refreshes each shard it holds with `XCLAIM … JUSTID` (which resets the idle
  time), inside a script that first checks the shard is still its own. Only a
  worker whose event loop stalls for longer than `claim_idle` can lose a shard
  (it is then run twice; its results are counted once either way).
- On close, the shards a worker still holds are handed back at once: moved to
  the consumer `handed-back` (never alive) with a huge idle time, so the next
  reclaim anywhere takes them without waiting.
- Nothing pushes a waiting worker: an idle `get` claims again every 20 ms at
  first, backing off to 200 ms (as the embedded queue does).
- `queued` (per (route, team)) maps each shard to the stream entry carrying it
  (set by `put`, cleared by the `ack` of that entry). The distributed sweeper
  reads them all to find unfinished shards no entry carries (an API replica
  died while enqueueing, or Redis lost writes) and re-enqueues them with
  `put_missing`, which checks the shard's own (route, team) hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from gateway.domain import Shard
from gateway.scheduling.fairness import Candidate, pick
from gateway.store.records import Delivery
from gateway.store.redis import scripts
from gateway.store.redis.coordination import RedisCoordination
from gateway.store.redis.keys import GROUP, STREAM_FIELD, Keys

log = logging.getLogger("batchyard.queue")

DEFAULT_CLAIM_IDLE = 30.0
_HANDED_BACK_IDLE_MS = 10**10  # an idle time no claim threshold is above

_EARLIEST = 32  # a team's batches (earliest deadlines first) the claim looks at, per route
_TRIES = 3  # candidates a claim reads from, best first, when others emptied the better ones meanwhile
_SCAN = 32  # a stream's idle entries a reclaim looks at
_AT_ONCE = 16  # per-slot scripts in flight at once on a cluster
_POLL_FIRST, _POLL_MAX = 0.02, 0.2


HANDED_BACK = "handed-back"  # the consumer that holds shards handed back by a closing worker: never alive


def consumer_name() -> str:
    """Unique per process start: a restarted worker does not inherit a dead one's shards, it reclaims them."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class RedisStreamQueue:
    def __init__(
        self, client: aioredis.Redis, routes: Collection[str], *, keys: Keys | None = None,
        consumer: str | None = None, claim_idle: float = DEFAULT_CLAIM_IDLE, owns_client: bool = False,
        weights: Mapping[str, float] | None = None, lane: Callable[[str], str] | None = None,
        alive: Callable[[], Awaitable[Collection[str]]] | None = None,
    ) -> None:
        self._r = client
        # A shard's route -> the route its streams are keyed by and workers host (`Config.lane`: a wildcard
        # route's concrete models queue under its pattern, which is what `routes` and `get` name)
        self._lane = lane or str
        self._k = keys or Keys()
        self._routes = [r for r in routes if r]  # what `get(None)` reads: every route of the config
        self.consumer = consumer or consumer_name()
        self.claim_idle = claim_idle
        self.weights = dict(weights or {})  # team -> weight (default 1)
        self._owns_client = owns_client
        # The names of the live workers (their heartbeats), read only when a reclaim finds idle entries
        self._alive = alive or self._live_workers
        self._put = client.register_script(scripts.PUT)
        self._ack = client.register_script(scripts.ACK)
        self._candidates = client.register_script(scripts.CANDIDATES)
        self._take = client.register_script(scripts.TAKE)
        self._refresh = client.register_script(scripts.REFRESH)
        self._reclaim_script = client.register_script(scripts.RECLAIM)
        self._held: dict[str, tuple[str, str]] = {}  # token -> (stream, entry id), read and not acked
        self._claimed_at = 0.0
        self._refresher: asyncio.Task[None] | None = None
        # Told the token of a held shard another worker took over (this one stalled): stop running it.
        self.on_lost: Callable[[str], None] | None = None

    # -- producing ---------------------------------------------------------------

    async def _enqueue(self, shard: Shard, only_missing: bool) -> bool:
        k = self._k
        lane, team = self._lane(shard.route), shard.team
        ready = k.ready(lane, team)
        # The route's registry first (its own slot; idempotent): a claim finds the team's queue from it
        await self._r.hset(k.teams(lane), team, ready)
        keys = [k.stream(lane, team, shard.batch_id), k.queued(lane, team), ready, k.streams(lane, team)]
        args: list[str | int] = [STREAM_FIELD, json.dumps(shard.to_json()), shard.key, GROUP, shard.deadline,
                                 "1" if only_missing else "0"]
        return await self._put(keys=keys, args=args) is not None

    async def put(self, shard: Shard) -> None:
        await self._enqueue(shard, only_missing=False)

    async def put_missing(self, shard: Shard) -> bool:
        """Enqueue `shard` unless an entry already carries it; True if it was enqueued."""
        return await self._enqueue(shard, only_missing=True)

    async def queued(self) -> dict[str, str]:
        """Shard key -> `entry id@stream` of the entry carrying it, on every route of the config."""
        slots = await self._teams(self._routes)
        replies = await self._pipelined([("hgetall", self._k.queued(route, team)) for route, team in slots])
        return {key: place for reply in replies for key, place in reply.items()}

    async def _pipelined(self, calls: list[tuple[str, str]]) -> list[Any]:
        """One non-transactional pipeline of one-key reads (a cluster client splits it per node)."""
        if not calls:
            return []
        async with self._r.pipeline(transaction=False) as p:
            for command, key in calls:
                getattr(p, command)(key)
            return cast(list[Any], await p.execute())

    async def _teams(self, routes: Collection[str]) -> list[tuple[str, str]]:
        """(route, team) of every team registered on `routes`, in the routes' order and each registry's."""
        wanted = list(routes)
        replies = await self._pipelined([("hkeys", self._k.teams(route)) for route in wanted])
        return [(route, str(team)) for route, teams in zip(wanted, replies, strict=True) for team in teams]

    async def _per_slot(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """`script` once per (keys, args), each in one slot: on one Redis in one non-transactional pipeline;
        on a cluster (whose client pipelines no scripts) all at once, `_AT_ONCE` calls in flight at most (a
        node's pool has 100 connections). A Redis that forgot the script has it loaded again."""
        if not calls:
            return []
        if isinstance(self._r, RedisCluster):
            limit = asyncio.Semaphore(_AT_ONCE)

            async def call(keys: list[str], args: list[Any]) -> Any:
                async with limit:
                    return await script(keys=keys, args=args)

            return list(await asyncio.gather(*(call(keys, args) for keys, args in calls)))
        async with self._r.pipeline(transaction=False) as p:
            for keys, args in calls:
                p.evalsha(script.sha, len(keys), *keys, *args)
            replies = await p.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                replies[i] = await script(keys=calls[i][0], args=calls[i][1])
            elif isinstance(reply, Exception):
                raise reply
        return cast(list[Any], replies)

    # -- consuming ---------------------------------------------------------------

    def _deliver(self, stream: str, entry_id: str, flat: list[str]) -> Delivery:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        shard = Shard.from_json(json.loads(fields[STREAM_FIELD]))
        token = f"{entry_id}@{stream}"
        self._held[token] = (stream, entry_id)
        return Delivery(shard=shard, token=token)

    async def get(self, routes: Collection[str] | None, timeout: float, skip_teams: Collection[str] = (),
                  skip_batches: Collection[str] = ()) -> Delivery | None:
        wanted = [r for r in (self._routes if routes is None else routes) if r]
        if not wanted:
            await asyncio.sleep(timeout)
            return None
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_loop(), name=f"queue-refresh-{self.consumer}")
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            # Every claim_idle / 4, in a long poll too (a shard handed back or left by a dead worker is
            # taken within that, as the embedded queue takes it at its next poll).
            if time.monotonic() - self._claimed_at >= self.claim_idle / 4:
                self._claimed_at = time.monotonic()
                # A stranded shard is taken whatever its team (a full worker asked for a newcomer's only:
                # taking a stranded one instead overflows by one shard, once).
                if (claimed := await self._reclaim(wanted)) is not None:
                    return claimed
            if (got := await self.claim(wanted, skip_teams, skip_batches)) is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX)

    async def claim(self, routes: Collection[str], skip_teams: Collection[str] = (),
                    skip_batches: Collection[str] = ()) -> Delivery | None:
        """One fair claim (see the module docs): the waiting shard `fairness.pick` gives, now ours; or None."""
        slots = [(route, team) for route, team in await self._teams(routes) if team not in skip_teams]
        replies = await self._per_slot(self._candidates, [
            ([self._k.ready(route, team)], [GROUP, _EARLIEST, *skip_batches]) for route, team in slots])
        candidates: list[Candidate] = []
        team_used: dict[tuple[str, str], float] = {}
        batch_used: dict[str, float] = {}
        for (route, team), reply in zip(slots, replies, strict=True):
            for i in range(0, len(reply), 4):
                stream, deadline, pending, waiting = reply[i:i + 4]
                batch = str(stream).rpartition(":")[2]
                # use per (route, team) and per batch (over the routes asked), as the embedded queue counts it
                team_used[route, team] = team_used.get((route, team), 0) + int(pending)
                batch_used[batch] = batch_used.get(batch, 0) + int(pending)
                if waiting:
                    candidates.append(Candidate(team, batch, int(float(deadline)), item=str(stream), scope=route))
        for _ in range(_TRIES):
            chosen = pick(candidates, team_used, batch_used, self.weights)
            if chosen is None:
                return None
            stream = cast(str, chosen.item)
            got = await self._take(keys=[stream], args=[GROUP, self.consumer])
            if got:
                return self._deliver(stream, got[0], got[1])
            candidates.remove(chosen)  # emptied by another worker since it was read: the next-best
        return None

    async def _reclaim(self, routes: Collection[str]) -> Delivery | None:
        """One shard idle for `claim_idle` seconds whose worker is dead (no heartbeat), now ours."""
        idle_ms = str(int(self.claim_idle * 1000))
        slots = await self._teams(routes)
        streams = [self._k.streams(route, team) for route, team in slots]
        looks = await self._per_slot(self._reclaim_script, [
            ([key], [GROUP, self.consumer, idle_ms, _SCAN, "look", '{"dead": [], "held": []}']) for key in streams])
        idle = [(key, {str(c) for c in consumers}) for key, consumers in zip(streams, looks, strict=True) if consumers]
        if not idle:
            return None
        live = set(await self._alive())
        held = list(self._held)
        for key, consumers in idle:
            dead = sorted(consumers - live - {self.consumer})
            if not dead and self.consumer not in consumers:
                continue
            opts = json.dumps({"dead": dead, "held": held})
            got = await self._reclaim_script(keys=[key], args=[GROUP, self.consumer, idle_ms, _SCAN, "take", opts])
            if got:
                stream, entry_id, flat = got[0], got[1], got[2] or []
                log.warning("took over shard entry %s on %s from a dead worker", entry_id, stream)
                return self._deliver(stream, entry_id, flat)
        return None

    async def _live_workers(self) -> list[str]:
        workers = await RedisCoordination(self._r, self._k, self.consumer).live_workers()
        return [str(w["name"]) for w in workers if "name" in w]

    async def ack(self, delivery: Delivery) -> None:
        stream, entry_id = self._held.pop(delivery.token, (None, None))
        if stream is None or entry_id is None:
            entry_id, _, stream = delivery.token.partition("@")
        shard = delivery.shard
        lane = self._lane(shard.route)
        keys = [stream, self._k.queued(lane, shard.team), self._k.ready(lane, shard.team),
                self._k.streams(lane, shard.team)]
        await self._ack(keys=keys, args=[GROUP, entry_id, shard.key])

    # -- holding on to shards --------------------------------------------------------

    async def _refresh_held(self, tokens: Collection[str] | None = None, *, hand_back: bool = False) -> None:
        by_stream: dict[str, list[str]] = {}
        for token in list(self._held if tokens is None else tokens):
            place = self._held.pop(token, None) if hand_back else self._held.get(token)
            if place is not None:  # handed back: not ours from here on, even if Redis can't be told
                by_stream.setdefault(place[0], []).append(place[1])
        target, idle = (HANDED_BACK, str(_HANDED_BACK_IDLE_MS)) if hand_back else (self.consumer, "")
        for stream, ids in by_stream.items():
            lost = await self._refresh(keys=[stream], args=[GROUP, self.consumer, target, idle, *ids])
            for entry_id in lost:
                # Not pending any more: acked while this ran (fine), or taken over after a stall.
                token = f"{entry_id}@{stream}"
                if self._held.pop(token, None) is not None:
                    log.warning("shard entry %s on %s was taken over by another worker", entry_id, stream)
                    if self.on_lost is not None:
                        self.on_lost(token)

    async def hand_back(self, delivery: Delivery) -> None:
        """Give a shard up unacked (its run failed in a way the pipeline could not handle): the next
        reclaim anywhere takes it, without waiting for the idle timeout."""
        await self._refresh_held([delivery.token], hand_back=True)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle / 3)
            try:
                await self._refresh_held()
            except Exception as exc:  # Redis away for a moment: the next round tries again
                log.warning("could not refresh held shards: %s", exc)

    # -- state ---------------------------------------------------------------------

    async def _streams(self) -> dict[str, list[str]]:
        """route -> its batch streams (every team's)."""
        slots = await self._teams(self._routes)
        replies = await self._pipelined([("smembers", self._k.streams(route, team)) for route, team in slots])
        by_route: dict[str, list[str]] = {route: [] for route in self._routes}
        for (route, _), members in zip(slots, replies, strict=True):
            by_route[route] += sorted(members)
        return by_route

    async def depth(self) -> dict[str, int]:
        """Shards waiting (not yet read by any worker), per route."""
        waiting, _ = await self.counts()
        return waiting

    async def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(waiting, in flight) per route; routes with none are left out."""
        by_route = await self._streams()
        pairs = [(route, stream) for route, streams in by_route.items() for stream in streams]
        async with self._r.pipeline(transaction=False) as p:
            for _, stream in pairs:
                p.xlen(stream)
                p.xpending(stream, GROUP)
            replies = await p.execute(raise_on_error=False)
        waiting: dict[str, int] = {}
        in_flight: dict[str, int] = {}
        for i, (route, _) in enumerate(pairs):
            length, pending = replies[2 * i], replies[2 * i + 1]
            held = int(pending["pending"]) if isinstance(pending, dict) else 0
            length = int(length) if isinstance(length, int) else 0
            if length - held > 0:
                waiting[route] = waiting.get(route, 0) + length - held
            if held:
                in_flight[route] = in_flight.get(route, 0) + held
        return waiting, in_flight

    async def forget_dead_consumers(self, is_alive: Callable[[str], bool], idle: float = 600.0) -> int:
        """Remove consumers that hold nothing, are not alive and have been idle for `idle` seconds (one
        per worker start would pile up otherwise); returns how many went."""
        removed = 0
        for streams in (await self._streams()).values():
            for stream in streams:
                try:
                    consumers: list[dict[str, Any]] = await self._r.xinfo_consumers(stream, GROUP)
                except ResponseError:
                    continue  # the stream went meanwhile
                for c in consumers:
                    name = str(c["name"])
                    if int(c["pending"]) == 0 and int(c["idle"]) >= idle * 1000 and not is_alive(name):
                        removed += int(await self._r.xgroup_delconsumer(stream, GROUP, name) == 0)
        return removed

    async def tidy(self, alive: Collection[str]) -> None:
        await self.forget_dead_consumers(set(alive).__contains__)

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._held:  # hand them back: the next XAUTOCLAIM anywhere takes them at once
            with contextlib.suppress(Exception):
                await self._refresh_held(hand_back=True)
        if self._owns_client:
            await self._r.aclose()


__all__ = ["DEFAULT_CLAIM_IDLE", "RedisStreamQueue", "consumer_name"]
