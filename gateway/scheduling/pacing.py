"""Pacing a team's requests on a route to its `rpm_limit` / `tpm_limit`, with the counters in the store.

One place every request of a shard passes, whatever the backend: `run_bounded` (upstream routes, local
engines) hands a shard's requests to the backend's `FairSlots` only as its `Pacer` is granted them by the
store's rate window (`RateWindows`: the contract is owned here and implemented by each store, over
`gateway.store.rates`): a request over the team's rate waits for the next window before it takes a slot, so
it holds back neither the team's other routes (each route has its own window) nor other teams (it holds no
slot while it waits). Native routes (provider batch jobs) are not paced: their requests are not sent one by
one.

tpm counts what the results report (`usage.total_tokens`). Counting only after the fact would let every
request of a window start before the first result is back (a burst of a whole shard), so each request
reserves an estimate when it is granted, and its result corrects the window by the difference. The
estimate is the mean `total_tokens` of this shard's results so far; before the first result, the first
request's body size / 4 (its prompt, about: a high guess for short replies, corrected as soon as results
come). A request starts while the window's tokens are under `tpm_limit` (at least one, however large the
estimate), so the overshoot is at most the requests of one grant, and the error of their estimates.

The runner says whose requests these are and under which limits with `pacing_with` (a context variable, like
`gateway.scheduling.fairness.running_for`, so the `Backend` interface keeps its shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.domain import BatchRequest, Result
from gateway.json_codec import dumps


@dataclass(frozen=True, slots=True)
class Grant:
    """What a rate window answers a `take`."""

    granted: int  # requests that may start now
    wait: float  # seconds until the current window ends (when `granted` is 0, when to ask again)


class RateWindows(Protocol):
    """The teams' rpm/tpm windows per route: the contract pacing owns, which each store implements (the
`rates` part of the `Store`: `gateway.store.rates`, its SQLite and Redis forms). The runner hands the
store's in, so scheduling, below the store, imports nothing of it."""

    window_seconds: float

    async def take(self, team: str, route: str, want: int, rpm: int | None, tpm: int | None,
                   estimate: int = 0) -> Grant:
        """Start up to `want` requests of `team` on `route` in the current window (`grantable`), and reserve
        `estimate` tokens for each one granted."""
    async def add_tokens(self, team: str, route: str, tokens: int) -> None:
        """Count tokens in the current window (negative: a reservation that was too large, given back)."""
    async def used(self, team: str, route: str) -> tuple[int, int]:
        """(requests, tokens) counted in the current window."""


GRANT_MAX = 16  # requests asked of the window at once (one store call per this many)
_RECHECK_SECONDS = 0.25  # a paced shard asks again at least this often (tokens reported meanwhile are flushed)


class Pacer:
    """One shard's requests on one route, under its team's rate limits (None: that limit is off)."""

    def __init__(self, rates: RateWindows, team: str, route: str, rpm: int | None, tpm: int | None) -> None:
        self._rates = rates
        self.team, self.route, self.rpm, self.tpm = team, route, rpm, tpm
        self._tokens = 0  # reported by results minus what was reserved for them, not yet in the store's window
        self._reserved: deque[int] = deque()  # the estimate reserved for each request granted and not back yet
        self._seen = self._seen_tokens = 0  # results back, and their total tokens (the estimate's mean)

    def estimate(self, first: BatchRequest | None) -> int:
        """Tokens to reserve per request (0 without a tpm limit)."""
        if self.tpm is None:
            return 0
        if self._seen:
            return max(1, round(self._seen_tokens / self._seen))
        return max(1, len(dumps(first.body)) // 4) if first is not None else 1

    def note(self, result: Result) -> None:
        """A result came back: its tokens, less what was reserved for it, go to the window at the next flush."""
        if self.tpm is None:
            return
        tokens = result.usage.total_tokens
        self._seen += 1
        self._seen_tokens += tokens
        self._tokens += tokens - (self._reserved.popleft() if self._reserved else 0)

    async def flush(self) -> None:
        tokens, self._tokens = self._tokens, 0
        if tokens:
            try:
                await self._rates.add_tokens(self.team, self.route, tokens)
            except BaseException:
                self._tokens += tokens  # not counted: the next flush tries again
                raise

    async def feed(self, requests: Sequence[BatchRequest], grant: Callable[[int], None],
                   caught_up: asyncio.Event) -> None:
        """Grant the requests as the team's window allows: `grant(n)` lets n more start. The next ask waits
        until the granted ones have started (`caught_up`), so a window's places are spent in it."""
        left = len(requests)
        while left > 0:
            await self.flush()
            estimate = self.estimate(requests[0] if requests else None)
            got = await self._rates.take(self.team, self.route, min(left, GRANT_MAX), self.rpm, self.tpm, estimate)
            if got.granted:
                left -= got.granted
                if estimate:
                    self._reserved.extend([estimate] * got.granted)
                caught_up.clear()
                grant(got.granted)
                await caught_up.wait()
            else:
                await asyncio.sleep(min(got.wait, _RECHECK_SECONDS) + 0.001)


_current: contextvars.ContextVar[Pacer | None] = contextvars.ContextVar("batchyard_pacer", default=None)


def current_pacer() -> Pacer | None:
    return _current.get()


@contextlib.contextmanager
def pacing_with(pacer: Pacer | None) -> Iterator[None]:
    """Requests started in this block (and tasks created in it) are paced by `pacer` (None: not paced)."""
    token = _current.set(pacer)
    try:
        yield
    finally:
        _current.reset(token)


__all__ = ["GRANT_MAX", "Grant", "Pacer", "RateWindows", "current_pacer", "pacing_with"]
