"""The team quota ledger: a store concept of its own (both modes keep it beside the records).

A batch is admitted against its team's quotas in one atomic step (a SQL
transaction, a Redis script), so two API replicas creating batches at once
never both pass the last free place. What is counted: each active batch of a
team and the requests it enqueues. An admission is let go when its batch has
finished: the coordinator's sweep (the one recovery path) releases those, so
a batch that failed, was cancelled or expired frees its place however it
ended; so does an admission whose batch was never stored (its creation died),
once `GRACE_SECONDS` old.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

MAX_ENQUEUED_REQUESTS = "max_enqueued_requests"
MAX_ACTIVE_BATCHES = "max_active_batches"
GRACE_SECONDS = 10.0  # an admission this young is kept though its batch is not listed active (being created)


@dataclass(frozen=True, slots=True)
class TeamLimits:
    max_enqueued_requests: int | None = None
    max_active_batches: int | None = None


@dataclass(frozen=True, slots=True)
class TeamUsage:
    active_batches: int = 0
    enqueued_requests: int = 0


class QuotaLedger(Protocol):
    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits) -> str | None:
        """Count the batch against its team's quotas if it fits all of them; else the name of the first
        quota it would exceed (`MAX_ACTIVE_BATCHES`, `MAX_ENQUEUED_REQUESTS`), and nothing is counted."""
    async def usage(self, team: str) -> TeamUsage: ...
    async def admitted(self) -> dict[str, float]:
        """Every batch counted now -> when it was admitted (epoch seconds)."""
    async def release(self, batch_ids: Collection[str]) -> None: ...
    async def add_spend(self, team: str, period: int, usd: float) -> None:
        """Add to the team's spend in the budget period that starts at `period` (epoch seconds; 0: for ever)."""
    async def spend(self, team: str, period: int) -> float: ...
    async def aclose(self) -> None: ...


def budget_period(duration: int | None, at: float) -> int:
    """The start of the budget period `at` falls in: periods of `duration` seconds from the epoch (0: one
    period for ever)."""
    return 0 if not duration else int(at // duration) * duration


def exceeded(usage: TeamUsage, requests: int, limits: TeamLimits) -> str | None:
    """The quota a new batch of `requests` would exceed, if any (the rule both ledgers apply)."""
    if limits.max_active_batches is not None and usage.active_batches + 1 > limits.max_active_batches:
        return MAX_ACTIVE_BATCHES
    if limits.max_enqueued_requests is not None and usage.enqueued_requests + requests > limits.max_enqueued_requests:
        return MAX_ENQUEUED_REQUESTS
    return None


__all__ = [
    "GRACE_SECONDS",
    "MAX_ACTIVE_BATCHES",
    "MAX_ENQUEUED_REQUESTS",
    "QuotaLedger",
    "TeamLimits",
    "TeamUsage",
    "budget_period",
    "exceeded",
]
