"""Fair share between teams: one rule, used at both granularities.

A route's capacity (shard claims in the queue, request slots in a backend) is
divided between the teams that have work waiting there, by weight: the next
unit goes to the waiting team with the least in use per unit of weight
(`used / weight`). Within a team it goes to the batch whose deadline
(`expires_at`) comes first (EDF); between batches of one deadline, to the one
with the least in use. Input order holds only within a batch. Nothing is
reserved: a team alone on a route gets all of it (work-conserving).

`FairSlots` applies the rule to a backend's request slots (not FIFO waiters:
a slot that frees starts the chosen flow's next request in the same step, so
a burst of completions cannot go to whoever happened to queue first). The runner says
whose requests a backend runs through `running_for` (a context variable, so
the `Backend` interface keeps its shape: `execute(requests)`).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

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


@dataclass(slots=True, eq=False)
class Flow:
    """One caller's requests waiting for slots (a shard's, in `run_bounded`): `start` runs the next one."""

    share: Share
    pending: int
    start: Callable[[], None]
    on_stop: Callable[[], None] | None = None  # told when `stop_sending` closes it
    closed: bool = False


_ALL: weakref.WeakSet[FairSlots] = weakref.WeakSet()  # every FairSlots of this process, for `stop_sending`


def stop_sending(batch_id: str) -> None:
    """No request of the batch starts any more, in this process; the ones in flight finish."""
    for slots in list(_ALL):
        slots.stop(batch_id)


class FairSlots:
    """A bound on requests in flight whose free slots go by `pick`, not first come, first served.

    Callers `open` a flow (how many requests, and how to start the next one);
    each free slot starts the next request of the flow `pick` chooses, at once
    and in the same step, so a flow with a sooner deadline or a smaller share
    takes every slot that frees while it has requests left.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.by_team: Counter[tuple[str, str]] = Counter()  # ("", team) -> slots in use
        self._by_batch: Counter[str] = Counter()
        self._weights: dict[str, float] = {}
        self._flows: list[Flow] = []  # the flows with requests waiting for a slot
        self._open: set[Flow] = set()  # every flow not closed (a paced one may have none waiting now)
        _ALL.add(self)

    def open(self, share: Share, pending: int, start: Callable[[], None],
             on_stop: Callable[[], None] | None = None) -> Flow:
        flow = Flow(share, pending, start, on_stop)
        self._weights[share.team] = share.weight
        self._open.add(flow)
        if pending > 0:
            self._flows.append(flow)
            self._wake()
        return flow

    def resize(self, limit: int) -> None:
        """A new bound (a paced one: `gateway.scheduling.busy_server`): more room starts waiting requests now;
        less lets those in flight finish and starts none until they are under it."""
        self.limit = max(0, limit)
        self._wake()

    @property
    def waiting(self) -> int:
        """Requests of open flows waiting for a slot."""
        return sum(f.pending for f in self._flows)

    def in_use(self, team: str) -> int:
        """The team's requests holding a slot now."""
        return self.by_team.get(("", team), 0)

    def add(self, flow: Flow, more: int) -> None:
        """`more` requests of an open flow may start now (a paced flow is opened with none: its pacer adds
        them as the team's rate allows, `gateway.scheduling.pacing`)."""
        if more <= 0 or flow.closed:
            return
        flow.pending += more
        if flow not in self._flows:
            self._flows.append(flow)
        self._wake()

    def close(self, flow: Flow) -> None:
        """No more of the flow's requests start (it was closed early)."""
        flow.pending = 0
        flow.closed = True
        self._open.discard(flow)
        if flow in self._flows:
            self._flows.remove(flow)

    def stop(self, batch_id: str) -> None:
        for flow in [f for f in self._open if f.share.batch_id == batch_id]:
            self.close(flow)
            if flow.on_stop is not None:
                flow.on_stop()

    def release(self, share: Share) -> None:
        """A request of `share` finished (or was cancelled): its slot goes to the next by `pick`."""
        self.used -= 1
        key = ("", share.team)
        self.by_team[key] -= 1
        self._by_batch[share.batch_id] -= 1
        if self.by_team[key] <= 0:
            del self.by_team[key]
        if self._by_batch[share.batch_id] <= 0:
            del self._by_batch[share.batch_id]
        self._wake()

    def _wake(self) -> None:
        while self.used < self.limit and self._flows:
            candidates = [Candidate(f.share.team, f.share.batch_id, f.share.deadline, item=f) for f in self._flows]
            chosen = pick(candidates, self.by_team, self._by_batch, self._weights)
            assert chosen is not None
            flow = cast(Flow, chosen.item)
            flow.pending -= 1
            if flow.pending <= 0:
                self._flows.remove(flow)
            self.used += 1
            self.by_team["", flow.share.team] += 1
            self._by_batch[flow.share.batch_id] += 1
            flow.start()


__all__ = [
    "DEFAULT_WEIGHT", "NOBODY", "Candidate", "FairSlots", "Flow", "Share", "current_share", "pick", "running_for",
    "stop_sending",
]
