"""Each team's standing, for `/metrics` and the dashboard: queued requests, active batches, quota headroom,
spend against budget (read from the Store and the quota ledger; in-flight requests are a live gauge)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.metrics import TeamState

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime


async def team_states(runtime: Runtime) -> list[TeamState]:
    queued: dict[str, int] = {}
    active: dict[str, int] = {}
    for batch in await runtime.store.batches.active():
        c = batch.counts
        queued[batch.owner] = queued.get(batch.owner, 0) + max(0, c.total - c.completed - c.failed)
        active[batch.owner] = active.get(batch.owner, 0) + 1
    states = []
    for team in runtime.config.batch.teams:
        name = team.team_id
        headroom: dict[str, float] = {}
        if runtime.quotas is not None and (team.max_active_batches or team.max_enqueued_requests
                                           or team.model_max_enqueued_requests):
            usage = await runtime.quotas.usage(name)
            if team.max_active_batches is not None:
                headroom["max_active_batches"] = team.max_active_batches - usage.active_batches
            if team.max_enqueued_requests is not None:
                headroom["max_enqueued_requests"] = team.max_enqueued_requests - usage.enqueued_requests
            for model, limit in team.model_max_enqueued_requests.items():  # one quota per model it names
                headroom[f"model_max_enqueued_requests:{model}"] = limit - usage.by_model.get(model, 0)
        spend = await runtime.budgets.spent(name)
        if team.max_budget is not None:
            headroom["max_budget"] = team.max_budget - spend
        states.append(TeamState(name, team.weight, queued.get(name, 0), active.get(name, 0), headroom, spend,
                                team.max_budget))
    return states


__all__ = ["team_states"]
