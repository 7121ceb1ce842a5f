"""Team budgets (LiteLLM's `max_budget` USD per `budget_duration`), over the quota ledger's spend counter.

Spend is the cost the runner already puts on each result (LiteLLM's price for an upstream call, the
route's `model_info` prices otherwise), added to the ledger as results are recorded, so every process
and a restarted one see one figure. Over budget: the service refuses new batches and the runner stops
sending (`gateway.pipeline.execute`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gateway.config.schema import Config
from gateway.records import Result
from gateway.store.quota import QuotaLedger, budget_period


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

    async def add(self, team: str, results: Sequence[Result]) -> None:
        usd = sum(r.cost_usd or 0.0 for r in results)
        if usd and self._ledger is not None:
            await self._ledger.add_spend(team, self.period(team), usd)

    async def spent(self, team: str) -> float:
        return 0.0 if self._ledger is None else await self._ledger.spend(team, self.period(team))

    async def over(self, team: str) -> bool:
        """The team has spent its budget for this period (never, without a `max_budget`)."""
        limit = self.limit(team)
        return limit is not None and await self.spent(team) >= limit


__all__ = ["Budgets"]
