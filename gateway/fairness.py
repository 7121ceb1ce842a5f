"""Fair share between teams: one rule, used at both granularities.

A route's capacity (shard claims in the queue, request slots in a backend) is
divided between the teams that have work waiting there, by weight: the next
unit goes to the waiting team with the least in use per unit of weight
(`used / weight`). Within a team it goes to the batch whose deadline
(`expires_at`) comes first (EDF); between batches of one deadline, to the one
with the least in use. Input order holds only within a batch. Nothing is
reserved: a team alone on a route gets all of it (work-conserving).

`FairSlots` applies the rule to a backend's request slots. The runner says
whose requests a backend runs through `running_for` (a context variable, so
the `Backend` interface keeps its shape: `execute(requests)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

DEFAULT_WEIGHT = 1.0


@dataclass(frozen=True, slots=True)
class Share:
    """Whose work this is: the team (a batch's owner), the batch, its deadline and the team's weight."""

    team: str = ""
    batch_id: str = ""
    deadline: int = 0
    weight: float = DEFAULT_WEIGHT


NOBODY = Share()  # work run outside a batch (tests, a direct backend call): one anonymous team
_current: contextvars.ContextVar[Share] = contextvars.ContextVar("batchyard_share", default=NOBODY)


def current_share() -> Share:
    return _current.get()


@contextlib.contextmanager
def running_for(share: Share) -> Iterator[None]:
    """Requests started in this block (and tasks created in it) are `share`'s."""
    token = _current.set(share)
    try:
        yield
    finally:
        _current.reset(token)


@dataclass(slots=True)
class Candidate:
    """Work waiting for a unit of capacity: one batch of one team (`item` is what the caller takes).

    `scope` is the capacity it competes for (the queue's claims are counted per route; a backend's slots
    are one pool: "")."""

    team: str
    batch_id: str
    deadline: int
    item: object = field(default=None, compare=False)
    scope: str = ""


def pick(candidates: Iterable[Candidate], team_used: Mapping[tuple[str, str], float],
         batch_used: Mapping[str, float], weights: Mapping[str, float]) -> Candidate | None:
    """The candidate the next unit goes to (see the module docs); ties go to the earlier candidate.
    `team_used`: units in use per (scope, team); `batch_used`: per batch."""
    best: Candidate | None = None
    best_key: tuple[float, int, float] | None = None
    for c in candidates:
        weight = weights.get(c.team, DEFAULT_WEIGHT) or DEFAULT_WEIGHT
        key = (team_used.get((c.scope, c.team), 0) / weight, c.deadline, batch_used.get(c.batch_id, 0))
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


class FairSlots:
    """A bound on requests in flight (like `asyncio.Semaphore`) whose free slots go by `pick`, not FIFO.

    Each waiter is one feeder (a shard's requests enter one at a time), so the
    waiting list is short: as long as the number of shards in flight.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.by_team: Counter[tuple[str, str]] = Counter()  # ("", team) -> slots in use
        self._by_batch: Counter[str] = Counter()
        self._weights: dict[str, float] = {}
        self._waiting: list[tuple[Candidate, asyncio.Future[None]]] = []

    async def acquire(self, share: Share) -> None:
        self._weights[share.team] = share.weight
        if self.used < self.limit and not self._waiting:
            self._take(share.team, share.batch_id)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (Candidate(share.team, share.batch_id, share.deadline), future)
        self._waiting.append(waiter)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted as we were cancelled: give it back
                self.release(share)
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    def release(self, share: Share) -> None:
        self.used -= 1
        self.by_team["", share.team] -= 1
        self._by_batch[share.batch_id] -= 1
        if self.by_team["", share.team] <= 0:
            del self.by_team["", share.team]
        if self._by_batch[share.batch_id] <= 0:
            del self._by_batch[share.batch_id]
        self._wake()

    def _take(self, team: str, batch_id: str) -> None:
        self.used += 1
        self.by_team["", team] += 1
        self._by_batch[batch_id] += 1

    def _wake(self) -> None:
        while self.used < self.limit and self._waiting:
            live = [w for w in self._waiting if not w[1].done()]
            self._waiting = live
            if not live:
                return
            chosen = pick((c for c, _ in live), self.by_team, self._by_batch, self._weights)
            assert chosen is not None
            waiter = next(w for w in live if w[0] is chosen)
            self._waiting.remove(waiter)
            self._take(chosen.team, chosen.batch_id)
            waiter[1].set_result(None)


__all__ = ["DEFAULT_WEIGHT", "NOBODY", "Candidate", "FairSlots", "Share", "current_share", "pick", "running_for"]
