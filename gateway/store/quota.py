"""The team quota ledger: the `quota` part of the `Store` (both modes keep it beside the records).

A batch is admitted against its team's quotas in one atomic step (a SQL
transaction, a Redis script), so two API replicas creating batches at once
never both pass the last free place. What is counted: each active batch of a
team, the requests it enqueues, and (when the team has per-model limits) its
requests per model. An admission is let go when its batch has finished: the
sweeper (the one recovery path) releases those, so a batch that
failed, was cancelled or expired frees its place however it ended; so does an
admission whose batch was never stored (its creation died), once
`GRACE_SECONDS` old.

The team's spend is read here too, but written by the shard ledger
(`ShardLedger.record_results`), in the same step that journals the results it
is the cost of: see `SpendTo`.

Money is held before it is spent: a holder (a native provider job, `gateway.lines.reservation`) reserves the
estimated cost of its lines against the team's budget in one atomic step with the read of the spend and of the
other holds (`fitting`, the rule both ledgers apply), so two workers never both take the budget's last dollar.
A hold is let go (`unreserve`) once the results it stood for are in the spend, or when its batch ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MAX_ENQUEUED_REQUESTS = "max_enqueued_requests"
MODEL_MAX_ENQUEUED_REQUESTS = "model_max_enqueued_requests"
MAX_ACTIVE_BATCHES = "max_active_batches"
GRACE_SECONDS = 10.0  # an admission this young is kept though its batch is not listed active (being created)


@dataclass(frozen=True, slots=True)
class TeamLimits:
    max_enqueued_requests: int | None = None
    max_active_batches: int | None = None
    # model_name -> requests of that model in the team's unfinished batches (only the models listed are limited)
    model_max_enqueued_requests: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TeamUsage:
    active_batches: int = 0
    enqueued_requests: int = 0
    # model_name -> requests enqueued, counted for batches admitted while the team had per-model limits
    by_model: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpendTo:
    """Where the cost of newly journaled results is added: the team's spend in the budget period that
    starts at `period` (epoch seconds; 0: for ever). The shard ledger adds it in the step that journals
    the results, so spend is exactly the cost of what the journal holds: a crash cannot fall between them,
    and a result recorded twice costs once."""

    team: str
    period: int = 0


def budget_period(duration: int | None, at: float) -> int:
    """The start of the budget period `at` falls in: periods of `duration` seconds from the epoch (0: one
    period for ever)."""
    return 0 if not duration else int(at // duration) * duration


# A hold may pass the room left by this much (USD): float sums of the same costs differ in the last bits
RESERVE_SLACK = 1e-9


def fitting(room: float, costs: Sequence[float]) -> tuple[int, float]:
    """How many of `costs`, from the first, fit in `room` USD together, and their total (the rule both
    ledgers apply; the Lua of `gateway.store.redis.quota` adds in the same order)."""
    count, total = 0, 0.0
    for cost in costs:
        if total + cost > room + RESERVE_SLACK:
            break
        total += cost
        count += 1
    return count, total


def exceeded(usage: TeamUsage, requests: int, by_model: Mapping[str, int], limits: TeamLimits) -> str | None:
    """The quota a new batch of `requests` (`by_model` per model) would exceed, if any (the rule both ledgers
    apply)."""
    if limits.max_active_batches is not None and usage.active_batches + 1 > limits.max_active_batches:
        return MAX_ACTIVE_BATCHES
    if limits.max_enqueued_requests is not None and usage.enqueued_requests + requests > limits.max_enqueued_requests:
        return MAX_ENQUEUED_REQUESTS
    if over_model(usage, by_model, limits) is not None:
        return MODEL_MAX_ENQUEUED_REQUESTS
    return None


def over_model(usage: TeamUsage, by_model: Mapping[str, int], limits: TeamLimits) -> str | None:
    """The first model (by name) whose per-model limit the batch's requests would exceed, if any."""
    for model, limit in sorted(limits.model_max_enqueued_requests.items()):
        if by_model.get(model, 0) and usage.by_model.get(model, 0) + by_model[model] > limit:
            return model
    return None


__all__ = [
    "GRACE_SECONDS",
    "MAX_ACTIVE_BATCHES",
    "MAX_ENQUEUED_REQUESTS",
    "MODEL_MAX_ENQUEUED_REQUESTS",
    "RESERVE_SLACK",
    "SpendTo",
    "TeamLimits",
    "TeamUsage",
    "budget_period",
    "exceeded",
    "fitting",
    "over_model",
]
