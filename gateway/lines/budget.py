"""Team budgets (LiteLLM's `max_budget` USD per `budget_duration`), over the quota ledger's spend counter.

Spend is the cost the runner already puts on each result (LiteLLM's price for an upstream call, the
route's `model_info` prices otherwise), added by the store in the step that journals the results
(`SpendTo`), so every process and a restarted one see one figure, and a crash between the two cannot
happen. Over budget: the service refuses new batches and the runner stops
sending (`gateway.pipeline.shard_runner`).

A backend that commits money in bulk (a native route's provider batch job) asks `over_budget_now()` before
each commitment: the runner says whose budget its requests spend with `spending_for` (a context variable,
like `gateway.scheduling.fairness.running_for`, so the `Backend` interface keeps its shape).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator

from gateway.config.schema import Config
from gateway.store.protocols import QuotaLedger
from gateway.store.quota import SpendTo, budget_period


class Budgets:
    def __init__(self, config: Config, ledger: QuotaLedger | None) -> None:
        self._ledger = ledger
        self._teams = {t.team_id: t for t in config.batch.teams}

    def limit(self, team: str) -> float | None:
        settings = self._teams.get(team)
        return settings.max_budget if settings is not None else None

    def period(self, team: str, at: float | None = None) -> int:
        settings = self._teams.get(team)
        return budget_period(settings.budget_seconds if settings is not None else None, at or time.time())

    def spend_to(self, team: str) -> SpendTo:
        """Where the cost of results recorded now goes: the team's current budget period."""
        return SpendTo(team, self.period(team))

    async def spent(self, team: str) -> float:
        return 0.0 if self._ledger is None else await self._ledger.spend(team, self.period(team))

    async def over(self, team: str) -> bool:
        """The team has spent its budget for this period (never, without a `max_budget`)."""
        limit = self.limit(team)
        return limit is not None and await self.spent(team) >= limit


OverBudget = Callable[[], Awaitable[bool]]  # is the team whose requests these are over its budget now?
_current: contextvars.ContextVar[OverBudget | None] = contextvars.ContextVar("batchyard_budget", default=None)


@contextlib.contextmanager
def spending_for(over: OverBudget | None) -> Iterator[None]:
    """Requests started in this block (and tasks created in it) spend the budget that `over` checks (None:
    a team without a budget)."""
    token = _current.set(over)
    try:
        yield
    finally:
        _current.reset(token)


def budgeted() -> bool:
    """Whether the current requests spend a team's budget (the team has a `max_budget`): a line whose cost
    cannot be known is refused then (`price_unknown`: providers.litellm_backend)."""
    return _current.get() is not None


async def over_budget_now() -> bool:
    """The budget the current requests spend is spent (never, outside `spending_for`: no team, no budget)."""
    over = _current.get()
    return over is not None and await over()


__all__ = ["Budgets", "OverBudget", "budgeted", "over_budget_now", "spending_for"]
