"""Rate windows: the `rates` part of the `Store`, the counters behind a team's `rpm_limit` / `tpm_limit` on a
route (LiteLLM proxy's names), shared by every process of a deployment.

Time is cut into fixed windows of `window_seconds` (60: the limits are per minute, as their names say; tests
shorten it). Per (team, route) and window the store counts the requests started and the tokens their results
reported. `take` grants requests in one atomic step (a SQL transaction, a Redis script), so two workers never
both pass the last place in a window; what it does not grant waits for the next window (the caller paces,
nothing is refused: `gateway.backends.pacing`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

DEFAULT_WINDOW_SECONDS = 60


@dataclass(frozen=True, slots=True)
class Grant:
    granted: int  # requests that may start now
    wait: float  # seconds until the current window ends (when `granted` is 0, when to ask again)


class RateWindows(Protocol):
    window_seconds: float

    async def take(self, team: str, route: str, want: int, rpm: int | None, tpm: int | None) -> Grant:
        """Start up to `want` requests of `team` on `route` in the current window: as many as `rpm` leaves
        (None: any), and only while the window's reported tokens are under `tpm` (None: no token limit)."""
    async def add_tokens(self, team: str, route: str, tokens: int) -> None:
        """Count tokens that results reported in the current window."""
    async def used(self, team: str, route: str) -> tuple[int, int]:
        """(requests, tokens) counted in the current window."""


def window_of(window_seconds: float, at: float | None = None) -> tuple[int, float]:
    """The current window's number and the seconds left in it."""
    at = time.time() if at is None else at
    number = int(at // window_seconds)
    return number, (number + 1) * window_seconds - at


def grantable(want: int, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> int:
    """How many of `want` may start in a window that holds `requests` and `tokens` (the rule both stores
    apply)."""
    if tpm is not None and tokens >= tpm:
        return 0
    return want if rpm is None else max(0, min(want, rpm - requests))


__all__ = ["DEFAULT_WINDOW_SECONDS", "Grant", "RateWindows", "grantable", "window_of"]
