"""Budget alerts: a `team.budget_threshold` event when a team's spend this budget period, plus what its running
batches and jobs hold, reaches a fraction of its `max_budget` (`batch_settings.budget_alerts`, or the team's own).

The check runs before each pass of the webhook sender (under its lease: one process at a time). Each alert is a
delivery whose id is derived from the team, the budget period and the fraction, so the store's `add` (which keeps
the first delivery of an id) makes it once per period however many processes or passes see the crossing; the
sender then sends it at least once, like a batch's event.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.config.schema import Config
from gateway.store.protocols import WebhookDeliveries
from gateway.store.webhook_deliveries import WebhookDelivery
from gateway.webhooks.events import BUDGET_THRESHOLD, WebhookTarget


class _Budgets(Protocol):
    def limit(self, team: str) -> float | None: ...
    def period(self, team: str, at: float | None = None) -> int: ...
    async def standing(self, team: str) -> tuple[float, float]: ...


def alert_ids(team: str, period: int, fraction: float) -> tuple[str, str]:
    """(webhook-id, event id) of a team's alert at `fraction` in the period that starts at `period`."""
    digest = hashlib.sha256(f"{team}:{period}:{fraction!r}:{BUDGET_THRESHOLD}".encode()).hexdigest()
    return f"wh_{digest[:32]}", f"evt_{digest[32:64]}"


def budget_alerts(config: Config, budgets: _Budgets, deliveries: WebhookDeliveries,
                  targets: Callable[[str], WebhookTarget | None]) -> Callable[[], Awaitable[int]]:
    """The check the sender runs before each pass: records the alerts owed now; returns how many are new."""
    fractions = {t.team_id: sorted(set(t.budget_alerts if t.budget_alerts is not None else config.batch.budget_alerts))
                 for t in config.batch.teams if t.max_budget is not None}

    async def check() -> int:
        made = 0
        for team, wanted in fractions.items():
            target, limit = targets(team), budgets.limit(team)
            if not wanted or limit is None or target is None or BUDGET_THRESHOLD not in target.events:
                continue
            spent, held = await budgets.standing(team)
            used = spent + held
            period = budgets.period(team)
            for fraction in wanted:
                if used < fraction * limit:
                    break
                webhook_id, event_id = alert_ids(team, period, fraction)
                now = int(time.time())
                data: dict[str, Any] = {"object": "team.budget", "team": team, "threshold": fraction,
                                        "max_budget": limit, "spend_usd": round(spent, 9),
                                        "reserved_usd": round(held, 9), "period_start": period}
                if await deliveries.add(WebhookDelivery(webhook_id, event_id, team, "", BUDGET_THRESHOLD, now,
                                                        next_at=now, data=data)):
                    made += 1
        return made

    return check


__all__ = ["alert_ids", "budget_alerts"]
