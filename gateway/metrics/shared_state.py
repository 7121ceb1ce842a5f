"""The gauges of shared state, read from the Store and the Queue at scrape time (`SharedState`): queue
depth per route, batches by status, and each team's standing (`TeamState`). Every API replica reports the
same truth, and nothing is summed across processes; a worker's own scrape leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.domain import BatchStatus
from gateway.metrics.instruments import UNROUTED

if TYPE_CHECKING:
    from gateway.store.protocols import Store

ACTIVE_STATUSES = [s for s in BatchStatus if not s.finished]


@dataclass(slots=True, eq=False)  # hashable: a registry keys its collectors by identity
class SharedState:
    """Gauges read from the Store and the Queue at scrape time (one process reports them)."""

    queue_depth: Mapping[str, int] = field(default_factory=dict)
    batches: Mapping[str, int] = field(default_factory=dict)
    teams: Sequence[TeamState] = ()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily("batchyard_queue_depth", "Shards waiting in the queue, by route.", labels=["route"])
        for route, n in sorted(self.queue_depth.items()):
            depth.add_metric([route or UNROUTED], n)
        yield depth
        batches = GaugeMetricFamily("batchyard_batches", "Batches not yet finished, by status.", labels=["status"])
        for status, n in sorted(self.batches.items()):
            batches.add_metric([status], n)
        yield batches
        yield from _team_families(self.teams)


@dataclass(frozen=True, slots=True)
class TeamState:
    """One team's standing, read at scrape time (`gateway.api.teams_view`)."""

    team: str
    weight: float
    queued: int  # requests of its unfinished batches without a result yet
    active_batches: int
    headroom: Mapping[str, float]  # quota name -> what is left (only the quotas the team has)
    spend_usd: float  # in the current budget period
    max_budget_usd: float | None


def _team_families(teams: Sequence[TeamState]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    families = {
        "queued": GaugeMetricFamily("batchyard_team_requests_queued", "Requests of a team's unfinished batches "
                                    "without a result yet.", labels=["team"]),
        "active": GaugeMetricFamily("batchyard_team_active_batches", "A team's unfinished batches.", labels=["team"]),
        "weight": GaugeMetricFamily("batchyard_team_weight", "A team's weight in the fair share of a route.",
                                    labels=["team"]),
        "headroom": GaugeMetricFamily("batchyard_team_quota_headroom", "What is left of a team's quota, by quota "
                                      "(max_active_batches, max_enqueued_requests, max_budget).",
                                      labels=["team", "quota"]),
        "spend": GaugeMetricFamily("batchyard_team_spend_usd", "A team's spend in its current budget period, USD.",
                                   labels=["team"]),
        "budget": GaugeMetricFamily("batchyard_team_max_budget_usd", "A team's max_budget, USD.", labels=["team"]),
    }
    for t in teams:
        families["queued"].add_metric([t.team], t.queued)
        families["active"].add_metric([t.team], t.active_batches)
        families["weight"].add_metric([t.team], t.weight)
        for quota, left in sorted(t.headroom.items()):
            families["headroom"].add_metric([t.team, quota], left)
        families["spend"].add_metric([t.team], t.spend_usd)
        if t.max_budget_usd is not None:
            families["budget"].add_metric([t.team], t.max_budget_usd)
    yield from families.values()


async def read_shared_state(store: Store, queue: Any, routes: Sequence[str]) -> SharedState:
    """What the Store and the Queue say now; every known route and active status appears, 0 when empty."""
    depth = dict.fromkeys(routes, 0)
    if queue is not None:
        depth.update(await queue.depth())
    batches = {s.value: 0 for s in ACTIVE_STATUSES}
    for batch in await store.batches.active():
        batches[batch.status.value] = batches.get(batch.status.value, 0) + 1
    return SharedState(queue_depth=depth, batches=batches)


__all__ = ["ACTIVE_STATUSES", "SharedState", "TeamState", "read_shared_state"]
