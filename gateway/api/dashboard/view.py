"""What the dashboard shows of one batch: its record and per-route stats, made ready to render.

Everything here is computed from the store's records (the batch record and
`Store.route_stats`), so the page and its polling endpoint show the same numbers
the API would give. Formatting lives here too, as Jinja filters.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway import tracing
from gateway.domain import BatchStatus, RouteStats, Usage
from gateway.store.records import BatchRecord

MAX_ERRORS_SHOWN = 10
# A finished batch with at least this share of its lines failed is shown as failed (red), whatever its
# status; fewer failed lines, as partly failed (amber). OpenAI's `completed` says only that the batch ran.
MOSTLY_FAILED = 0.5
NONE = "\u2013"  # an en dash: "no value yet"


@dataclass(slots=True)
class RouteProgress:
    """A batch's progress on one of its routes, as its page shows it (a config's route is `config check`'s
    `RouteRow`)."""

    name: str  # "" for lines answered at validation
    stats: RouteStats
    planned: int | None = None  # the route's requests in this batch, while it runs (from its shards)
    unavailable: str | None = None  # why a worker cannot run this route (its engine cannot start), if so
    unpriced: bool = False  # the config gives this route no price: its cost is unknown, not $0.00
    background: str | None = None  # a background route's pacing on its shared server (`background_words`)
    # re-runs of replies that did not match their schema, and lines still invalid after them (the store's live
    # counts while the batch runs, the merge's once it is finalized)
    reruns: int = 0
    output_invalid: int = 0

    @property
    def cost_label(self) -> str:
        return "unpriced" if self.unpriced and not self.stats.cost_usd else fmt_usd(self.stats.cost_usd)

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
    routes: list[RouteProgress] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    errors_more: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    waiting: str | None = None  # "waiting: disk full since 10:02 UTC": a fault of the machine holds it
    input_filename: str | None = None  # the uploaded input file's name (None: the file is gone)
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
    def outcome(self) -> str:
        """"failed" when most lines failed (`MOSTLY_FAILED`), "partial" when some did, else "": the card's
        colour, apart from the status (a `completed` batch whose every line failed is not a success)."""
        if not self.failed:
            return ""
        return "failed" if self.total and self.failed >= MOSTLY_FAILED * self.total else "partial"

    @property
    def cost_label(self) -> str:
        """The cost, or "unpriced" where a route that ran has no price (its part is unknown, not free)."""
        unpriced = any(r.unpriced and r.stats.requests and not r.stats.cost_usd for r in self.routes)
        if not unpriced:
            return fmt_usd(self.cost_usd)
        return "unpriced" if not self.cost_usd else f"{fmt_usd(self.cost_usd)} + unpriced"

    def bar(self, width: int = 1000) -> tuple[int, int]:
        """The progress bar's completed and failed lengths out of `width` (an SVG's: the page's CSP allows no
        inline style)."""
        if not self.total:
            return (width, 0) if self.finished else (0, 0)
        ok = round(width * self.completed / self.total)
        return ok, min(round(width * self.failed / self.total), width - ok)

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else (100 if self.finished else 0)


def _checked(summary: Any, live: RouteStats | None) -> tuple[int, int]:
    """(reruns, output_invalid) of a route: its finished batch's summary, else the live counts."""
    if not isinstance(summary, dict) or "reruns" not in summary:
        return (live.reruns, live.output_invalid) if live is not None else (0, 0)
    reruns, invalid = summary.get("reruns"), summary.get("output_invalid")
    return (reruns if isinstance(reruns, int) else 0), (invalid if isinstance(invalid, int) else 0)


def batch_view(
    rec: BatchRecord, routes: dict[str, RouteStats], planned: dict[str, int] | None = None, now: float | None = None,
    unavailable: Mapping[str, str] | None = None, waiting: str | None = None,
    background: Mapping[str, Mapping[str, Any]] | None = None, *,
    input_filename: str | None = None, unpriced: Collection[str] = (),
) -> BatchView:
    """`planned`: requests per route (from the batch's shards), so a running batch lists every route
    from the start, each with its own done / total. `unavailable`: route -> why a worker cannot run it (a
    finished batch keeps its own in its record). `unpriced`: the routes the config gives no price."""
    now = time.time() if now is None else now
    done = rec.counts.completed + rec.counts.failed
    rate = _rate(rec, done, now)
    remaining = max(rec.counts.total - done, 0)
    eta = remaining / rate if rate and remaining and rec.status == BatchStatus.IN_PROGRESS else None
    planned = planned or {}
    routes = {name: _with_route_cost(stats, rec.routes.get(name)) for name, stats in routes.items()}
    names = sorted(set(routes) | set(planned), key=lambda n: (n == "", n))  # the validation bucket last
    unavailable = unavailable or {}
    paced = background or {}
    rows = [RouteProgress(n, routes.get(n) or RouteStats(), planned.get(n), unavailable.get(n) or _kept(rec, n),
                          n in unpriced,
                          background_words(paced[n]) if n in paced and not rec.status.finished else None,
                          *_checked(rec.routes.get(n), routes.get(n)))
            for n in names]
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
        input_filename=input_filename,
    )


def _kept(rec: BatchRecord, route: str) -> str | None:
    """Why the route could not run, as the batch's record keeps it (the shard runner notes it)."""
    facts = rec.routes.get(route)
    why = facts.get("unavailable") if isinstance(facts, dict) else None
    return why if isinstance(why, str) else None


def background_words(state: Mapping[str, Any]) -> str:
    """A background route's pacing in a few words: in flight of allowed, the server's queue, what to know."""
    words = f"background: {state.get('in_flight', 0)} in flight of {state.get('allowed', 0)} allowed"
    if state.get("metrics_up") is False:
        words += " (the server's /metrics cannot be read: low fixed concurrency)"
    elif state.get("server_waiting") is not None:
        words += f", server waiting {state['server_waiting']}"
    return words + (f"; {state['notice']}" if state.get("notice") else "")


def _with_route_cost(stats: RouteStats, summary: Any) -> RouteStats:
    """A native route prices its upstream batch jobs when they finish, into the batch record's
    `routes[name]["cost_usd"]`, not per result: take it from there when the results carry none."""
    cost = summary.get("cost_usd") if isinstance(summary, dict) else None
    if stats.cost_usd or not isinstance(cost, int | float):
        return stats
    return replace(stats, cost_usd=float(cost))


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
