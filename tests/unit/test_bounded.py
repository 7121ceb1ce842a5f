"""A backend's request slots, as tables: who gets the next slot (`pick`, `FairSlots`) and what a shard's run
(`BoundedRun`) holds and gives back (`gateway.backends.bounded`). Pacing: tests/unit/test_pacing.py.

Calls here take a few event-loop ticks (no timers), so every order below is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gateway.backends.bounded import run_bounded
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.scheduling.fairness import Candidate, FairSlots, Share, pick, running_for, stop_sending

# -- the fair pick ----------------------------------------------------------------------------------------

# (why, candidates as (team, batch, deadline[, scope]), slots in use per team (scope "") or (scope, team),
#  per batch, weights, the index picked)
PICKS: list[tuple[str, list[tuple], dict, dict[str, float], dict[str, float], int | None]] = [
    ("the team with less in use", [("a", "a1", 0), ("b", "b1", 0)], {"a": 2, "b": 1}, {}, {}, 1),
    ("in use per unit of weight (3/2 < 2/1)", [("a", "a1", 0), ("b", "b1", 0)], {"a": 3, "b": 2}, {}, {"a": 2}, 0),
    ("a weight of 0 counts as 1", [("a", "a1", 0), ("b", "b1", 0)], {"a": 1, "b": 2}, {}, {"b": 0}, 0),
    ("within a team, the sooner deadline", [("a", "a1", 200), ("a", "a2", 100)], {}, {}, {}, 1),
    ("a sooner deadline does not beat a smaller share", [("a", "a1", 100), ("b", "b1", 200)], {"a": 1}, {}, {}, 1),
    ("one deadline: the batch with less in use", [("a", "a1", 100), ("a", "a2", 100)], {}, {"a1": 2, "a2": 1}, {},
     1),
    ("all equal: the earlier candidate", [("a", "a1", 0), ("b", "b1", 0)], {}, {}, {}, 0),
    ("use counts in its own scope only", [("a", "a1", 0, "r1"), ("b", "b1", 0, "r2")],
     {("r2", "a"): 5, ("r2", "b"): 1}, {}, {}, 0),
    ("nobody waiting", [], {}, {}, {}, None),
]


@pytest.mark.parametrize(("candidates", "team_used", "batch_used", "weights", "picked"), [c[1:] for c in PICKS],
                         ids=[c[0] for c in PICKS])
def test_pick(candidates: list[tuple], team_used: dict, batch_used: dict[str, float], weights: dict[str, float],
              picked: int | None) -> None:
    waiting = [Candidate(c[0], c[1], c[2], scope=c[3] if len(c) > 3 else "") for c in candidates]
    used = {k if isinstance(k, tuple) else ("", k): v for k, v in team_used.items()}
    chosen = pick(waiting, used, batch_used, weights)
    assert chosen is (None if picked is None else waiting[picked])


# (why, slots, flows opened in this order as (team, batch, deadline, weight, requests), the batches in the
#  order their requests start while the oldest request in flight finishes, one at a time)
ORDERS: list[tuple[str, int, list[tuple[str, str, int, float, int]], str]] = [
    ("a team alone takes every slot", 2, [("A", "a", 0, 1, 3)], "a a a"),
    ("a newcomer gets the next free slot, then they alternate", 2,
     [("A", "a", 0, 1, 3), ("B", "b", 0, 1, 3)], "a a b a b b"),
    ("weight 2 holds two slots to weight 1's one", 3,
     [("A", "a", 0, 2, 6), ("B", "b", 0, 1, 3)], "a a a b a a b a b"),
    ("within a team, the sooner deadline first", 1,
     [("A", "late", 200, 1, 2), ("A", "soon", 100, 1, 2)], "late soon soon late"),
    ("one deadline: the batch with less in use", 2,
     [("A", "x", 0, 1, 3), ("A", "y", 0, 1, 3)], "x x y x y y"),
]


@pytest.mark.parametrize(("limit", "flows", "order"), [c[1:] for c in ORDERS], ids=[c[0] for c in ORDERS])
def test_free_slots_go_by_the_pick(limit: int, flows: list[tuple[str, str, int, float, int]], order: str) -> None:
    slots, started, running = FairSlots(limit), list[str](), list[Share]()

    def starter(share: Share) -> Callable[[], None]:
        def start() -> None:
            started.append(share.batch_id)
            running.append(share)
            assert slots.used <= limit
        return start

    for team, batch, deadline, weight, n in flows:
        share = Share(team, batch, deadline, weight)
        slots.open(share, n, starter(share))
    while running:
        slots.release(running.pop(0))
    assert " ".join(started) == order
    assert (slots.used, dict(slots.by_team)) == (0, {})


# -- one shard's run: the slots it holds and gives back ---------------------------------------------------

@dataclass
class Case:
    why: str
    limit: int
    requests: int
    fails: int | None = None  # the line whose call raises
    close_after: int | None = None  # the consumer stops after this many results
    stop_after: int | None = None  # stop_sending(the batch) after this many results
    # expected
    results: int = 0
    peak: int = 0  # calls in flight at once, at most
    error: str | None = None


RUNS = [
    Case("every request runs, at most the limit at once", limit=3, requests=10, results=10, peak=3),
    Case("fewer requests than slots", limit=8, requests=3, results=3, peak=3),
    Case("no request: nothing runs", limit=2, requests=0, results=0, peak=0),
    Case("the consumer stops: the calls in flight are cancelled", limit=3, requests=10, close_after=2, results=2,
         peak=3),
    Case("a call that raises ends the run with its error", limit=2, requests=6, fails=3, results=2, peak=2,
         error="line 3 broke"),
    Case("stop_sending: the calls in flight finish, no more start", limit=2, requests=10, stop_after=2,
         results=4, peak=2),
]


class Calls:
    """The backend's per-request call: a few loop ticks, counting what is in flight."""

    def __init__(self, fails: int | None) -> None:
        self.fails, self.in_flight, self.peak, self.ended = fails, 0, 0, 0

    async def __call__(self, req: BatchRequest) -> Result:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            if req.line == self.fails:
                raise RuntimeError(f"line {req.line} broke")
            return Result(line=req.line, custom_id=f"c{req.line}", status_code=200, body={}, model=req.model)
        finally:
            self.in_flight -= 1
            self.ended += 1


def _requests(n: int) -> list[BatchRequest]:
    return [BatchRequest(i, f"c{i}", Endpoint.CHAT, {"model": "m", "messages": []}) for i in range(1, n + 1)]


@pytest.mark.parametrize("case", RUNS, ids=[c.why for c in RUNS])
async def test_a_run_holds_at_most_the_limit_and_gives_every_slot_back(case: Case) -> None:
    slots, calls = FairSlots(case.limit), Calls(case.fails)
    batch = f"batch-{id(case)}"
    got: list[Result] = []
    error: str | None = None
    with running_for(Share("team", batch)):
        run = run_bounded(_requests(case.requests), calls, slots)
    try:
        async for result in run:
            got.append(result)
            if len(got) == case.close_after:
                break
            if len(got) == case.stop_after:
                stop_sending(batch)
    except RuntimeError as exc:
        error = str(exc)
    finally:
        await run.aclose()
    assert (len(got), calls.peak, error) == (case.results, case.peak, case.error)
    assert (calls.in_flight, slots.used, dict(slots.by_team)) == (0, 0, {})  # nothing left running or held
    assert len({r.line for r in got}) == len(got)


async def test_two_runs_share_one_limit_and_split_it_once_both_wait() -> None:
    slots = FairSlots(4)
    calls = {team: Calls(None) for team in "AB"}
    peaks: list[tuple[int, int]] = []

    async def run(team: str) -> int:
        with running_for(Share(team, f"batch-{team}")):
            results = run_bounded(_requests(12), calls[team], slots)
        count = 0
        async for _ in results:
            count += 1
            peaks.append((slots.in_use("A"), slots.in_use("B")))
        return count

    assert await asyncio.gather(run("A"), run("B")) == [12, 12]
    assert max(a + b for a, b in peaks) <= 4 and slots.used == 0
    assert (2, 2) in peaks  # while both had requests waiting, two slots each
