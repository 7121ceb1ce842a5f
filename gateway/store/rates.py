"""Rate windows: the `rates` part of the `Store`, the counters behind a team's `rpm_limit` / `tpm_limit` on a
route (LiteLLM proxy's names), shared by every process of a deployment: the rules both stores apply to
implement `gateway.scheduling.pacing.RateWindows` (its contract, with the `Grant` it answers).

Time is cut into fixed windows of `window_seconds` (60: the limits are per minute, as their names say; tests
shorten it). Per (team, route) and window the store counts the requests started and their tokens: an
estimate reserved when they start, corrected by what their results report. `take` grants requests in one
atomic step (a SQL transaction, a Redis script), so two workers never both pass the last place in a window;
what it does not grant waits for the next window (the caller paces, nothing is refused:
`gateway.scheduling.pacing`). Windows are numbered by each process's clock (NTP-synchronised machines agree
to well under a window).
"""

from __future__ import annotations

import time

DEFAULT_WINDOW_SECONDS = 60


def window_of(window_seconds: float, at: float | None = None) -> tuple[int, float]:
    """The current window's number and the seconds left in it."""
    at = time.time() if at is None else at
    number = int(at // window_seconds)
    return number, (number + 1) * window_seconds - at


def grantable(want: int, requests: int, tokens: int, rpm: int | None, tpm: int | None, estimate: int = 0) -> int:
    """How many of `want` may start in a window that holds `requests` and `tokens` (the rule both stores
    apply): as many as `rpm` leaves (None: any); under `tpm` (None: no token limit), as many as the tokens
    left hold at `estimate` each, and at least one while any are left."""
    granted = want if rpm is None else max(0, min(want, rpm - requests))
    if tpm is not None:
        if tokens >= tpm:
            return 0
        if estimate > 0:
            granted = min(granted, max(1, (tpm - tokens) // estimate))
    return granted


__all__ = ["DEFAULT_WINDOW_SECONDS", "grantable", "window_of"]
