"""Team budgets (LiteLLM's `max_budget` USD per `budget_duration`), over the quota ledger's spend counter.

Spend is the cost the runner already puts on each result (LiteLLM's price for an upstream call, the
route's `model_info` prices otherwise), added by the store in the step that journals the results
(`SpendTo`), so every process and a restarted one see one figure, and a crash between the two cannot
happen. Over budget: the service refuses new batches and the runner stops
sending (`gateway.pipeline.execute`).
"""

from __future__ import annotations

import time

from gateway.config.schema import Config
from gateway.store.quota import QuotaLedger, SpendTo, budget_period


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


__all__ = ["Budgets"]
