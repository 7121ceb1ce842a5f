"""The shared `Queue`: Redis Streams with one consumer group.

- One stream per route (`stream:{route}`), so a worker reads only the routes it
  hosts: a GPU worker for `llama-3-8b` never sees another model's shards.
- Every worker is a consumer of the group `workers` under its own name; a
  shard read with XREADGROUP stays in the group's pending list until the
  worker acks it (XACK, then XDEL: a stream holds only unacked shards).
- A dead worker's pending shards are taken over once they have been idle for
  `claim_idle` seconds (default 30) and their consumer has no heartbeat key
  (`worker:{name}`, which `gateway.pipeline.coordinator` keeps with a TTL of
  `claim_idle`): XAUTOCLAIM's rule plus a liveness check, in one script
  (XPENDING IDLE, EXISTS, XCLAIM), so a Redis restart that leaves every entry
  idle for a moment does not hand live workers' shards around.
- A live worker never loses a long shard: every `claim_idle / 3` seconds it
  refreshes each shard it holds with `XCLAIM … JUSTID` (which resets the idle
  time), inside a script that first checks the shard is still its own. Only a
  worker whose event loop stalls for longer than `claim_idle` can lose a shard
  (it is then run twice; its results are counted once either way).
- On close, the shards a worker still holds are handed back at once: moved to
  the consumer `handed-back` (never alive) with a huge idle time, so the next
  reclaim anywhere takes them without waiting.
- `queued` maps each shard to the stream entry carrying it (set by `put`,
  cleared by the `ack` of that entry). The distributed sweeper uses it to find
  unfinished shards no entry carries (an API replica died while enqueueing, or
  Redis lost writes) and re-enqueues them with `put_missing`.
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
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.records import Shard
from gateway.store.base import Delivery
from gateway.store.keys import GROUP, STREAM_FIELD, Keys

log = logging.getLogger("batchyard.queue")

DEFAULT_CLAIM_IDLE = 30.0
_HANDED_BACK_IDLE_MS = 10**10  # an idle time no claim threshold is above

_PUT = """
local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], id)
return id
"""

# Enqueue only when no entry carries the shard (the sweeper's re-enqueue).
_PUT_MISSING = """
if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return false end
local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], id)
return id
"""

_ACK = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[2] then redis.call('HDEL', KEYS[2], ARGV[3]) end
return 1
"""

# Keep held entries ours (idle back to zero), or hand them to another consumer.
# ARGV: group, me, target consumer, idle ms ('' for zero), ids…; returns the ids that were no longer ours.
_REFRESH = """
local lost = {}
for i = 5, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] ~= nil and p[1][2] == ARGV[2] then
    if ARGV[4] == '' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'JUSTID')
    else
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'IDLE', ARGV[4], 'JUSTID')
    end
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

# XAUTOCLAIM with a liveness check: the first entry idle for ARGV[3] ms whose consumer has no
# heartbeat key (ARGV[5] .. consumer), or is us but not held any more (ids held: ARGV[6…]), becomes ours.
# ARGV: group, me, min idle ms, scan count, heartbeat key prefix, held ids…
_RECLAIM = """
local held = {}
for i = 6, #ARGV do held[ARGV[i]] = true end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
for _, p in ipairs(pending) do
  local dead
  if p[2] == ARGV[2] then dead = not held[p[1]] else dead = redis.call('EXISTS', ARGV[5] .. p[2]) == 0 end
  if dead then
    local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], p[1])
    if got[1] then return got[1] end
  end
end
return false
"""


HANDED_BACK = "handed-back"  # the consumer that holds shards handed back by a closing worker: never alive


def consumer_name() -> str:
    """Unique per process start: a restarted worker does not inherit a dead one's shards, it reclaims them."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class RedisStreamQueue:
    def __init__(
        self, client: aioredis.Redis, routes: Collection[str], *, keys: Keys | None = None,
        consumer: str | None = None, claim_idle: float = DEFAULT_CLAIM_IDLE, owns_client: bool = False,
    ) -> None:
        self._r = client
        self._k = keys or Keys()
        self._routes = [r for r in routes if r]  # what `get(None)` reads: every route of the config
        self.consumer = consumer or consumer_name()
        self.claim_idle = claim_idle
        self._owns_client = owns_client
        self._put = client.register_script(_PUT)
        self._put_missing = client.register_script(_PUT_MISSING)
        self._ack = client.register_script(_ACK)
        self._refresh = client.register_script(_REFRESH)
        self._reclaim_script = client.register_script(_RECLAIM)
        self._groups: set[str] = set()
        self._held: dict[str, tuple[str, str]] = {}  # token -> (stream, entry id), read and not acked
        self._buffer: deque[Delivery] = deque()
        self._claimed_at = 0.0
        self._refresher: asyncio.Task[None] | None = None
        # Told the token of a held shard another worker took over (this one stalled): stop running it.
        self.on_lost: Callable[[str], None] | None = None

    # -- producing ---------------------------------------------------------------

    async def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            await self._r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)

    def _args(self, shard: Shard) -> tuple[list[str], list[str]]:
        keys = [self._k.stream(shard.route), self._k.queued]
        return keys, [STREAM_FIELD, json.dumps(shard.to_json()), shard.key]

    async def put(self, shard: Shard) -> None:
        await self._ensure_group(self._k.stream(shard.route))
        keys, args = self._args(shard)
        await self._put(keys=keys, args=args)

    async def put_missing(self, shard: Shard) -> bool:
        """Enqueue `shard` unless an entry already carries it; True if it was enqueued."""
        await self._ensure_group(self._k.stream(shard.route))
        keys, args = self._args(shard)
        return await self._put_missing(keys=keys, args=args) is not None

    async def queued(self) -> dict[str, str]:
        """Shard key -> the stream entry carrying it."""
        return cast(dict[str, str], await self._r.hgetall(self._k.queued))

    # -- consuming ---------------------------------------------------------------

    def _deliver(self, stream: str, entry_id: str, fields: dict[str, str]) -> Delivery:
        shard = Shard.from_json(json.loads(fields[STREAM_FIELD]))
        token = f"{entry_id}@{stream}"
        self._held[token] = (stream, entry_id)
        return Delivery(shard=shard, token=token)

    async def get(self, routes: Collection[str] | None, timeout: float) -> Delivery | None:
        streams = [self._k.stream(r) for r in (self._routes if routes is None else routes) if r]
        if not streams:
            await asyncio.sleep(timeout)
            return None
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_loop(), name=f"queue-refresh-{self.consumer}")
        wanted = set(streams)
        for i, delivery in enumerate(self._buffer):
            if delivery.token.partition("@")[2] in wanted:
                del self._buffer[i]
                return delivery
        for stream in streams:
            await self._ensure_group(stream)
        if time.monotonic() - self._claimed_at >= self.claim_idle / 4:
            self._claimed_at = time.monotonic()
            if (claimed := await self._reclaim(streams)) is not None:
                return claimed
        try:
            reply = await self._r.xreadgroup(
                GROUP, self.consumer, dict.fromkeys(streams, ">"), count=1, block=max(1, int(timeout * 1000))
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                raise
            self._groups.clear()  # Redis lost its data (or the stream went): the groups come back next call
            return None
        streams_read = cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], reply or [])
        deliveries = [self._deliver(stream, entry_id, fields) for stream, entries in streams_read
                      for entry_id, fields in entries if fields]
        if not deliveries:
            return None
        self._buffer.extend(deliveries[1:])
        return deliveries[0]

    async def _reclaim(self, streams: Iterable[str]) -> Delivery | None:
        """One shard idle for `claim_idle` seconds whose worker is dead (no heartbeat), now ours."""
        idle_ms = str(int(self.claim_idle * 1000))
        heartbeat = self._k.worker("")
        for stream in streams:
            held = [entry_id for s, entry_id in self._held.values() if s == stream]
            args: list[str | int] = [GROUP, self.consumer, idle_ms, 32, heartbeat, *held]
            got = await self._reclaim_script(keys=[stream], args=args)
            if got:
                entry_id, flat = got[0], got[1] or []
                log.warning("took over shard entry %s on %s from a dead worker", entry_id, stream)
                return self._deliver(stream, entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
        return None

    async def ack(self, delivery: Delivery) -> None:
        stream, entry_id = self._held.pop(delivery.token, (None, None))
        if stream is None or entry_id is None:
            entry_id, _, stream = delivery.token.partition("@")
        await self._ack(keys=[stream, self._k.queued], args=[GROUP, entry_id, delivery.shard.key])

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

    async def depth(self) -> dict[str, int]:
        """Shards waiting (not yet read by any worker), per route."""
        waiting, _ = await self.counts()
        return waiting

    async def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(waiting, in flight) per route; routes with none are left out."""
        streams = [self._k.stream(r) for r in self._routes]
        async with self._r.pipeline(transaction=False) as p:
            for stream in streams:
                p.xlen(stream)
                p.xpending(stream, GROUP)
            replies = await p.execute(raise_on_error=False)
        waiting: dict[str, int] = {}
        in_flight: dict[str, int] = {}
        for i, stream in enumerate(streams):
            length, pending = replies[2 * i], replies[2 * i + 1]
            held = int(pending["pending"]) if isinstance(pending, dict) else 0
            length = int(length) if isinstance(length, int) else 0
            route = self._k.route_of(stream)
            if length - held > 0:
                waiting[route] = length - held
            if held:
                in_flight[route] = held
        return waiting, in_flight

    async def forget_dead_consumers(self, is_alive: Callable[[str], bool], idle: float = 600.0) -> int:
        """Remove consumers that hold nothing, are not alive and have been idle for `idle` seconds (one
        per worker start would pile up otherwise); returns how many went."""
        removed = 0
        for route in self._routes:
            stream = self._k.stream(route)
            try:
                consumers = await self._r.xinfo_consumers(stream, GROUP)
            except ResponseError:
                continue  # no stream or no group yet
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
