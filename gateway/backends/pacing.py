"""Pacing a team's requests on a route to its `rpm_limit` / `tpm_limit`, with the counters in the store.

One place every request of a shard passes, whatever the backend: `run_bounded` (upstream routes, local
engines) hands a shard's requests to the backend's `FairSlots` only as its `Pacer` is granted them by the
store's rate window (`gateway.store.rates`): a request over the team's rate waits for the next window before
it takes a slot, so it holds back neither the team's other routes (each route has its own window) nor other
teams (it holds no slot while it waits). Native routes (provider batch jobs) are not paced: their requests
are not sent one by one.

tpm counts what the results report (`usage.total_tokens`), added to the window as results come back; a
request starts only while the window's tokens are under `tpm_limit`. No estimate is reserved before
sending: most lines carry no `max_tokens`, so an honest estimate is the model's whole context and would pace
far below the real rate. What this allows, as LiteLLM proxy's own limiter does, is an overshoot by the
tokens of the requests already started when the window filled: at most one grant (`GRANT_MAX` requests) per
shard in flight, and the next window starts with them counted.

The runner says whose requests these are and under which limits with `pacing_with` (a context variable, like
`gateway.fairness.running_for`, so the `Backend` interface keeps its shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator

from gateway.records import Result
from gateway.store.rates import RateWindows

GRANT_MAX = 16  # requests asked of the window at once: one store call per this many, and the tpm overshoot bound
_RECHECK_SECONDS = 0.25  # a paced shard asks again at least this often (tokens reported meanwhile are flushed)


class Pacer:
    """One shard's requests on one route, under its team's rate limits (None: that limit is off)."""

    def __init__(self, rates: RateWindows, team: str, route: str, rpm: int | None, tpm: int | None) -> None:
        self._rates = rates
        self.team, self.route, self.rpm, self.tpm = team, route, rpm, tpm
        self._tokens = 0  # reported by results, not yet added to the store's window

    def note(self, result: Result) -> None:
        """A result came back: count its tokens (added to the window at the next `flush`)."""
        if self.tpm is not None:
            self._tokens += result.usage.total_tokens

    async def flush(self) -> None:
        tokens, self._tokens = self._tokens, 0
        if tokens:
            try:
                await self._rates.add_tokens(self.team, self.route, tokens)
            except BaseException:
                self._tokens += tokens  # not counted: the next flush tries again
                raise

    async def feed(self, total: int, grant: Callable[[int], None], caught_up: asyncio.Event) -> None:
        """Grant `total` requests, as the team's window allows: `grant(n)` lets n more start. The next ask
        waits until the granted ones have started (`caught_up`), so a window's places are spent in it."""
        left = total
        while left > 0:
            await self.flush()
            got = await self._rates.take(self.team, self.route, min(left, GRANT_MAX), self.rpm, self.tpm)
            if got.granted:
                left -= got.granted
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


__all__ = ["GRANT_MAX", "Pacer", "current_pacer", "pacing_with"]
