"""Where a rule lives in Lua and in Python, both run the same cases and give the same answer (a real redis-server,
and a 3-master Redis Cluster: `any_redis`).

- The quota rule: `gateway.store.quota.exceeded` (the SQLite ledger's) and the ADMIT script of
  `gateway.store.redis.quota`, on the same admitted batches and the same new batch.
- The budget hold: `gateway.store.quota.fitting` (the SQLite ledger's) and the RESERVE script of
  `gateway.store.redis.quota`, on the same holds and the same new one.
- The rate grant: `gateway.store.rates.grantable` (the SQLite windows') and the take script of
  `gateway.store.redis.rates`, on the same window (requests and tokens counted already) and the same ask.
- The fair pick: `gateway.scheduling.fairness.pick` over the SQLite queue's rows, and the Redis queue's claim
  (the CANDIDATES script in each (route, team) slot, the pick in Python, the TAKE script), on the same waiting
  and held shards. Every case has one winner: between keys that tie, the two break ties by their own orders
  (the embedded queue's rows, Redis' hash order).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.domain import Shard
from gateway.scheduling.fairness import Candidate, pick
from gateway.store.quota import MAX_ACTIVE_BATCHES as BATCHES
from gateway.store.quota import MAX_ENQUEUED_REQUESTS as REQUESTS
from gateway.store.quota import MODEL_MAX_ENQUEUED_REQUESTS as PER_MODEL
from gateway.store.quota import TeamLimits, exceeded, fitting
from gateway.store.rates import grantable, window_of
from gateway.store.redis.connection import open_redis
from gateway.store.redis.keys import GROUP
from gateway.store.redis.queue import RedisStreamQueue
from gateway.store.redis.quota import RedisQuotaLedger
from gateway.store.redis.rates import RedisRates
from gateway.store.sqlite.store import SQLiteStore
from tests.support.loops import run_apart
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

# -- the quota rule ----------------------------------------------------------------------------------

Admitted = tuple[int, Mapping[str, int] | None]  # a batch counted already: its requests, per model (or None)

# (admitted batches, the team's limits, the new batch's requests and per model, the quota it exceeds)
QUOTA: list[tuple[list[Admitted], TeamLimits, int, dict[str, int], str | None]] = [
    ([], TeamLimits(), 10**6, {}, None),
    ([(1, None), (1, None)], TeamLimits(max_active_batches=2), 1, {}, BATCHES),
    ([(1, None)], TeamLimits(max_active_batches=2), 1, {}, None),
    ([], TeamLimits(max_active_batches=0), 1, {}, BATCHES),
    ([(60, None)], TeamLimits(max_enqueued_requests=100), 40, {}, None),
    ([(60, None)], TeamLimits(max_enqueued_requests=100), 41, {}, REQUESTS),
    ([(60, None), (1, None)], TeamLimits(max_active_batches=2, max_enqueued_requests=10), 50, {}, BATCHES),
    ([(6, {"m": 6})], TeamLimits(model_max_enqueued_requests={"m": 10}), 4, {"m": 4}, None),
    ([(6, {"m": 6})], TeamLimits(model_max_enqueued_requests={"m": 10}), 5, {"m": 5}, PER_MODEL),
    ([(3, {"m": 3}), (4, {"m": 4})], TeamLimits(model_max_enqueued_requests={"m": 10}), 4, {"m": 4}, PER_MODEL),
    ([(6, {"m": 6})], TeamLimits(model_max_enqueued_requests={"m": 10}), 50, {"n": 50}, None),  # n has no limit
    ([(9, None)], TeamLimits(model_max_enqueued_requests={"m": 10}), 10, {"m": 10}, None),  # counted before limits
    ([(6, {"m": 6, "n": 1})], TeamLimits(model_max_enqueued_requests={"m": 10, "n": 1}), 2, {"m": 1, "n": 1},
     PER_MODEL),
    ([], TeamLimits(model_max_enqueued_requests={"m": 0}), 3, {"n": 3, "m": 0}, None),  # none of m: not over
    ([], TeamLimits(max_enqueued_requests=5, model_max_enqueued_requests={"m": 1}), 6, {"m": 6}, REQUESTS),
]


@pytest.mark.parametrize(("admitted", "limits", "requests", "by_model", "expected"), QUOTA)
def test_the_quota_rule_in_lua_and_in_python(
    any_redis: RedisServer | RedisClusterServers, tmp_path: Path, admitted: list[Admitted], limits: TeamLimits,
    requests: int, by_model: dict[str, int], expected: str | None,
) -> None:
    async def scenario() -> tuple[str | None, str | None, str | None]:
        any_redis.flush()
        client, keys = await open_redis(any_redis.url)  # on a cluster: its keys in one slot
        lua = RedisQuotaLedger(client, keys)
        sqlite = SQLiteStore(tmp_path / "q.sqlite3")
        try:
            for i, (n, models) in enumerate(admitted):
                for ledger in (lua, sqlite.quota):
                    assert await ledger.admit("team", f"b{i}", n, TeamLimits(), models) is None
            python = exceeded(await lua.usage("team"), requests, by_model, limits)
            return (await lua.admit("team", "new", requests, limits, by_model), python,
                    await sqlite.quota.admit("team", "new", requests, limits, by_model))
        finally:
            await client.aclose()
            await sqlite.aclose()

    assert run_apart(scenario()) == (expected, expected, expected)


# -- the budget hold ---------------------------------------------------------------------------------

# (what other holders hold, the limit, the new hold's line costs, how many fit)
HOLDS: list[tuple[list[float], float, list[float], int]] = [
    ([], 1.0, [0.25, 0.25, 0.25, 0.25], 4),  # exactly the limit
    ([], 1.0, [0.25, 0.25, 0.25, 0.25, 0.01], 4),
    ([0.5], 1.0, [0.2, 0.2, 0.2], 2),
    ([0.5, 0.5], 1.0, [0.0001], 0),  # the budget is held whole
    ([0.7], 0.5, [0.1], 0),  # held past a lowered limit: none, never a negative room
    ([], 1.0, [2.0, 0.1], 0),  # a prefix only: a later cheap line does not jump the queue
    ([0.1, 0.2], 0.6, [0.1, 0.1, 0.1, 0.1], 3),  # 0.1 + 0.2 + 0.3: float sums within the slack
    ([], 0.0, [0.0, 0.0], 2),  # unpriced lines hold nothing, and fit
    ([], 5.0, [], 0),
]


@pytest.mark.parametrize(("held", "limit", "costs", "expected"), HOLDS)
def test_the_budget_hold_in_lua_and_in_python(any_redis: RedisServer | RedisClusterServers, tmp_path: Path,
                                              held: list[float], limit: float, costs: list[float],
                                              expected: int) -> None:
    async def scenario() -> tuple[int, int, int]:
        any_redis.flush()
        client, keys = await open_redis(any_redis.url)  # on a cluster: the spend and the holds in one slot
        lua = RedisQuotaLedger(client, keys)
        sqlite = SQLiteStore(tmp_path / "h.sqlite3")
        try:
            for i, usd in enumerate(held):
                for ledger in (lua, sqlite.quota):
                    assert await ledger.reserve("team", 0, f"other{i}/", [usd], 10.0) == 1
            python, _ = fitting(limit - sum(held), costs)
            return (await lua.reserve("team", 0, "new/", costs, limit), python,
                    await sqlite.quota.reserve("team", 0, "new/", costs, limit))
        finally:
            await client.aclose()
            await sqlite.aclose()

    assert run_apart(scenario()) == (expected, expected, expected)


# -- the rate grant ------------------------------------------------------------------------------------

# (want, requests and tokens in the window already, rpm, tpm, estimate per request, how many are granted)
GRANTS: list[tuple[int, int, int, int | None, int | None, int, int]] = [
    (5, 0, 0, None, None, 0, 5),  # no limit
    (5, 6, 0, 8, None, 0, 2),  # rpm: what is left
    (5, 8, 0, 8, None, 0, 0),  # rpm: the window is full
    (5, 9, 0, 8, None, 0, 0),  # rpm: over already (a limit lowered): none, never negative
    (5, 0, 100, None, 100, 0, 0),  # tpm: the window's tokens are spent
    (5, 0, 99, None, 100, 0, 5),  # tpm: under, no estimate yet: all
    (5, 0, 10, None, 100, 30, 3),  # tpm: as many as the tokens left hold at the estimate
    (5, 0, 90, None, 100, 30, 1),  # tpm: at least one while any are left
    (5, 2, 10, 4, 100, 30, 2),  # both: the smaller
    (0, 0, 0, 8, 100, 10, 0),  # nothing asked
]


@pytest.mark.parametrize(("want", "requests", "tokens", "rpm", "tpm", "estimate", "expected"), GRANTS)
def test_the_rate_grant_in_lua_and_in_python(redis_server: RedisServer, want: int, requests: int, tokens: int,
                                             rpm: int | None, tpm: int | None, estimate: int, expected: int) -> None:
    window_seconds = 10**6  # one window for the whole case: the count set and the take see the same one

    async def lua_grant() -> int:
        client, keys = await open_redis(redis_server.url)
        await client.flushall()
        await client.hset(keys.rate("team", "m", window_of(window_seconds)[0]),
                          mapping={"requests": requests, "tokens": tokens})
        try:
            return (await RedisRates(client, keys, window_seconds).take("team", "m", want, rpm, tpm, estimate)).granted
        finally:
            await client.aclose()

    assert (run_apart(lua_grant()), grantable(want, requests, tokens, rpm, tpm, estimate)) == (expected, expected)


# -- the fair pick -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """One batch's shards on one route: `waiting` to be claimed, `held` by a worker already."""

    route: str
    team: str
    batch: str
    deadline: int
    waiting: int = 1
    held: int = 0


@dataclass(frozen=True)
class Case:
    work: list[Work]
    expected: str | None  # the batch whose shard is claimed next
    weights: dict[str, float] = field(default_factory=dict)
    skip_teams: list[str] = field(default_factory=list)
    skip_batches: list[str] = field(default_factory=list)


PICKS = {
    "alone, the sooner deadline first": Case([Work("r", "a", "a1", 200), Work("r", "a", "a2", 100)], "a2"),
    "the team with less in use": Case([Work("r", "a", "a1", 100, held=2), Work("r", "b", "b1", 900)], "b1"),
    "in use per unit of weight": Case([Work("r", "a", "a1", 900, held=2), Work("r", "b", "b1", 100, held=1)], "a1",
                                      weights={"a": 4.0}),
    "a heavier team still waits its turn": Case(
        [Work("r", "a", "a1", 100, held=3), Work("r", "b", "b1", 900, held=1)], "b1", weights={"a": 2.0}),
    "one deadline: the batch with less in use": Case(
        [Work("r", "a", "a1", 100, held=1), Work("r", "a", "a2", 100)], "a2"),
    "a held batch counts for its team": Case(
        [Work("r", "a", "a1", 100, waiting=0, held=2), Work("r", "a", "a2", 200), Work("r", "b", "b1", 300, held=1)],
        "b1"),
    "use is counted per route": Case(
        [Work("r1", "a", "a1", 100, held=3), Work("r2", "a", "a2", 300), Work("r1", "b", "b1", 200, held=1)], "a2"),
    "a skipped team is passed over": Case([Work("r", "a", "a1", 100), Work("r", "b", "b1", 900, held=5)], "b1",
                                          skip_teams=["a"]),
    "a skipped batch is passed over": Case([Work("r", "a", "a1", 100), Work("r", "a", "a2", 900)], "a2",
                                           skip_batches=["a1"]),
    "nothing waiting": Case([Work("r", "a", "a1", 100, waiting=0, held=1)], None),
    "three teams, weights and deadlines": Case(
        [Work("r", "a", "a1", 300, held=1), Work("r", "b", "b1", 100, held=2), Work("r", "c", "c1", 200, held=3)],
        "c1", weights={"b": 1.5, "c": 4.0}),
}


def _python_pick(case: Case) -> str | None:
    """The SQLite queue's inputs to `pick`: one candidate per waiting (route, batch), use per (route, team)
    and per batch."""
    team_used: Counter[tuple[str, str]] = Counter()
    batch_used: Counter[str] = Counter()
    for w in case.work:
        team_used[w.route, w.team] += w.held
        batch_used[w.batch] += w.held
    candidates = [Candidate(w.team, w.batch, w.deadline, scope=w.route) for w in case.work
                  if w.waiting and w.team not in case.skip_teams and w.batch not in case.skip_batches]
    chosen = pick(candidates, team_used, batch_used, case.weights)
    return chosen.batch_id if chosen is not None else None


@pytest.mark.parametrize("name", PICKS)
def test_the_fair_pick_in_lua_and_in_python(any_redis: RedisServer | RedisClusterServers, name: str) -> None:
    case = PICKS[name]
    routes = sorted({w.route for w in case.work})

    async def lua_pick() -> str | None:
        any_redis.flush()
        client, keys = await open_redis(any_redis.url)  # on a cluster: each (route, team) queue in its slot
        try:
            queue = RedisStreamQueue(client, routes, keys=keys, consumer="me")
            for w in case.work:
                for i in range(w.held + w.waiting):
                    await queue.put(Shard(w.batch, i, w.route, 1, team=w.team, deadline=w.deadline))
                if w.held:  # another worker holds these (read, not acked)
                    await client.xreadgroup(GROUP, "other", {keys.stream(w.route, w.team, w.batch): ">"}, count=w.held)
            queue.weights = case.weights
            got = await queue.claim(routes, case.skip_teams, case.skip_batches)
            return got.shard.batch_id if got is not None else None
        finally:
            await client.aclose()

    assert (run_apart(lua_pick()), _python_pick(case)) == (case.expected, case.expected)


# -- a background route's shared concurrency -------------------------------------------------------


def test_the_shared_concurrency_in_lua_and_in_python(redis_server: RedisServer) -> None:
    """One sequence of turns (steps, stale steps, equal shares, a part that expires) on both: the same replies."""
    from gateway.scheduling.busy_server import ShareAsk, exchange
    from gateway.store.redis.coordination import RedisCoordination

    turns = [("a", 40, 0, 100.0, (0, 12)), ("b", 40, 0, 100.1, None), ("a", 40, 12, 100.2, None),
             ("b", 40, 0, 100.3, (0, 3)), ("c", 3, 0, 100.4, None), ("a", 40, 6, 100.5, (1, 16)),
             ("b", 40, 6, 100.6, None), ("c", 3, 0, 100.7, None), ("a", 1, 1, 101.0, None),
             ("b", 40, 8, 103.0, None), ("c", 3, 3, 110.0, (2, 7)), ("b", 0, 0, 110.1, None)]
    asks = [ShareAsk("route", w, want, held, now, initial=2, proposal=p) for w, want, held, now, p in turns]

    async def in_lua() -> list[tuple[int, int, float, int, int]]:
        client, keys = await open_redis(redis_server.url)
        await client.flushall()
        coordination = RedisCoordination(client, keys, "test")
        try:
            replies = [await coordination.share_concurrency(a) for a in asks]
            return [(s.allowed, s.version, s.stepped_at, s.reserved, s.grant) for s in replies]
        finally:
            await client.aclose()

    state = None
    in_python = []
    for ask in asks:
        state, reply = exchange(state, ask)
        in_python.append((reply.allowed, reply.version, reply.stepped_at, reply.reserved, reply.grant))
    assert run_apart(in_lua()) == in_python
