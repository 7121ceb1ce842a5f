"""What the dashboard shows of one batch: its record and per-route stats, made ready to render.

Everything here is computed from the store's records (the batch record and
`Store.route_stats`), so the page and its polling endpoint show the same numbers
the API would give. Formatting lives here too, as Jinja filters.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway import tracing
from gateway.domain import BatchStatus, RouteStats, Usage
from gateway.store.objects import BatchRecord

MAX_ERRORS_SHOWN = 10
NONE = "\u2013"  # an en dash: "no value yet"


@dataclass(slots=True)
class RouteRow:
    name: str  # "" for lines answered at validation
    stats: RouteStats
    planned: int | None = None  # the route's requests in this batch, while it runs (from its shards)
    unavailable: str | None = None  # why a worker cannot run this route (its engine cannot start), if so
    # re-runs of replies that did not match their schema, and lines still invalid after them (known once the
    # batch is finalized: the merge counts them)
    reruns: int = 0
    output_invalid: int = 0

    @property
    def progress(self) -> str:
        done = fmt_int(self.stats.requests)
        return done if self.planned is None else f"{done} / {fmt_int(self.planned)}"

    @property
    def label(self) -> str:
        return self.name or "answered at validation"


@dataclass(slots=True)
class BatchView:
    id: str
    status: str
    finished: bool
    endpoint: str
    created_at: int
    total: int
    completed: int
    failed: int
    rate: float | None  # requests per second since in_progress_at
    eta_seconds: float | None
    usage: Usage
    cost_usd: float
    routes: list[RouteRow] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    errors_more: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    waiting: str | None = None  # "waiting: disk full since 10:02 UTC": a fault of the machine holds it
    trace_id: str | None = None  # the batch's trace (gateway.tracing), to look it up in Jaeger or Tempo

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def eta_label(self) -> str:
        if self.finished:
            return "done" if self.status == BatchStatus.COMPLETED.value else NONE
        if self.eta_seconds is not None:
            return fmt_duration(self.eta_seconds)
        return "finalizing" if self.status == BatchStatus.FINALIZING.value else NONE

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else (100 if self.finished else 0)


def _checked(summary: Any) -> tuple[int, int]:
    """(reruns, output_invalid) of a finished batch's route summary (0, 0 while it runs)."""
    if not isinstance(summary, dict):
        return 0, 0
    reruns, invalid = summary.get("reruns"), summary.get("output_invalid")
    return (reruns if isinstance(reruns, int) else 0), (invalid if isinstance(invalid, int) else 0)


def batch_view(
    rec: BatchRecord, routes: dict[str, RouteStats], planned: dict[str, int] | None = None, now: float | None = None,
    unavailable: Mapping[str, str] | None = None, waiting: str | None = None,
) -> BatchView:
    """`planned`: requests per route (from the batch's shards), so a running batch lists every route
    from the start, each with its own done / total. `unavailable`: route -> why a worker cannot run it."""
    now = time.time() if now is None else now
    done = rec.counts.completed + rec.counts.failed
    rate = _rate(rec, done, now)
    remaining = max(rec.counts.total - done, 0)
    eta = remaining / rate if rate and remaining and rec.status == BatchStatus.IN_PROGRESS else None
    planned = planned or {}
    routes = {name: _with_route_cost(stats, rec.routes.get(name)) for name, stats in routes.items()}
    names = sorted(set(routes) | set(planned), key=lambda n: (n == "", n))  # the validation bucket last
    unavailable = unavailable or {}
    rows = [RouteRow(n, routes.get(n) or RouteStats(), planned.get(n), unavailable.get(n),
                     *_checked(rec.routes.get(n))) for n in names]
    return BatchView(
        id=rec.id,
        status=rec.status.value,
        finished=rec.status.finished,
        endpoint=rec.endpoint,
        created_at=rec.created_at,
        total=rec.counts.total,
        completed=rec.counts.completed,
        failed=rec.counts.failed,
        rate=rate,
        eta_seconds=eta,
        usage=rec.usage,
        cost_usd=sum(s.cost_usd for s in routes.values()),
        routes=rows,
        errors=rec.errors[:MAX_ERRORS_SHOWN],
        errors_more=max(len(rec.errors) - MAX_ERRORS_SHOWN, 0),
        # a Message Batch's results file is its own (not in the team's files): its results link serves it
        output_file_id=rec.output_file_id if rec.files_owner == rec.owner else None,
        error_file_id=rec.error_file_id,
        metadata=rec.metadata,
        waiting=None if rec.status.finished else waiting,
        trace_id=tracing.trace_id(rec.trace_context),
    )


def _with_route_cost(stats: RouteStats, summary: Any) -> RouteStats:
    """A native route prices its upstream batch jobs when they finish, into the batch record's
    `routes[name]["cost_usd"]`, not per result: take it from there when the results carry none."""
    cost = summary.get("cost_usd") if isinstance(summary, dict) else None
    if stats.cost_usd or not isinstance(cost, int | float):
        return stats
    return RouteStats(stats.completed, stats.failed, stats.input_tokens, stats.output_tokens, float(cost))


def _rate(rec: BatchRecord, done: int, now: float) -> float | None:
    """Requests finished per second while the batch ran (up to now, or until it stopped running)."""
    if rec.in_progress_at is None or not done:
        return None
    ends = (rec.finalizing_at, rec.cancelling_at, rec.completed_at, rec.failed_at, rec.expired_at, rec.cancelled_at)
    end = min((t for t in ends if t is not None), default=now)
    # Record times are whole seconds: a batch that ran within one second has run for "up to a second".
    return done / max(end - rec.in_progress_at, 1.0)


# -- filters ------------------------------------------------------------------


def fmt_int(value: int) -> str:
    return f"{value:,}"


def fmt_usd(value: float) -> str:
    """Dollars with enough digits for per-request prices: $0.00, $0.000125, $12.50."""
    if value == 0:
        return "$0.00"
    text = f"{value:,.6f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return NONE
    return f"{value:,.1f} req/s" if value < 100 else f"{value:,.0f} req/s"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    seconds = max(round(seconds), 1)
    if seconds < 90:
        return f"~{seconds} s"
    if seconds < 90 * 60:
        return f"~{round(seconds / 60)} min"
    return f"~{seconds / 3600:.1f} h"


def fmt_time(ts: int | None) -> str:
    if ts is None:
        return NONE
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


FILTERS = {"num": fmt_int, "usd": fmt_usd, "rate": fmt_rate, "duration": fmt_duration, "utc": fmt_time}
