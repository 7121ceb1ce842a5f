"""Prometheus metrics, through `prometheus-client`.

What is counted where it happens (any process: the API, a `batchyard worker`,
an embedded worker process):
- `batchyard_requests_total{team, route, status}`: results recorded (status is
  the HTTP status, or the error code of a request that never ran);
- `batchyard_tokens_total{team, route, type}`: input and output tokens of
  successful results;
- `batchyard_cost_usd_total{team, route}`: what those results cost;
- `batchyard_upstream_usage_rejected_total{route}`: successful results whose reply's `usage`
  was not sane non-negative integers (`gateway.records.Usage.read`): counted as zero tokens and cost;
- `batchyard_requests_in_flight{route}`: requests being executed right now;
- `batchyard_team_requests_in_flight{team, route}`: the same by team (its share
  of the route is this over the route's total);
- `batchyard_request_duration_seconds{route}`: upstream/engine latency of each call.

What describes shared state (`batchyard_queue_depth{route}`, `batchyard_batches{status}`,
and per team `batchyard_team_requests_queued`, `batchyard_team_active_batches`,
`batchyard_team_weight`, `batchyard_team_quota_headroom{quota}`,
`batchyard_team_spend_usd` and `batchyard_team_max_budget_usd`)
is read from the Queue and the Store at scrape time by `SharedState`, so every API
replica reports the same truth and nothing is summed across processes.

Several processes on one machine: set `PROMETHEUS_MULTIPROC_DIR` in the
environment of every process before it starts (prometheus-client reads it when
it is first imported; the metrics here are built lazily, on first use, so
importing this module is not that moment). Each process then writes its values
to files in that directory and a scrape sums them (`MultiProcessCollector`).
A process's live gauges are dropped when it exits (`mark_process_dead`, at exit
here; `process_exited(pid)` for a parent whose child died hard), and
`prepare_multiprocess_dir()` at server start removes the files of processes
that are gone.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gateway.records import MAX_USAGE_TOKENS, BatchStatus, Result, billable

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.registry import Collector

    from gateway.store.protocols import Store

log = logging.getLogger("batchyard.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNROUTED = "unrouted"  # the route label of lines answered at validation (no route: unknown model, bad url)
ACTIVE_STATUSES = [s for s in BatchStatus if not s.finished]
# LLM calls take from tens of milliseconds (an embedding) to minutes (a long generation).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_DB_FILE = re.compile(r"_(\d+)\.db$")


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


@dataclass(frozen=True, slots=True)
class _Metrics:
    requests: Counter
    tokens: Counter
    cost: Counter
    usage_rejected: Counter
    in_flight: Gauge
    team_in_flight: Gauge
    latency: Histogram


@functools.cache
def _metrics() -> _Metrics:
    """Built on first use, so the multiprocess setting is read as late as possible."""
    directory = multiprocess_dir()
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        atexit.register(process_exited, os.getpid())
    from prometheus_client import Counter, Gauge, Histogram

    return _Metrics(
        requests=Counter("batchyard_requests", "Requests with a recorded result, by team, route and status "
                         "(HTTP status, or the error code of a request that never ran).",
                         ["team", "route", "status"]),
        tokens=Counter("batchyard_tokens", "Tokens of successful requests, by team, route and type (input, output).",
                       ["team", "route", "type"]),
        cost=Counter("batchyard_cost_usd", "Cost of requests in US dollars, by team and route.", ["team", "route"]),
        usage_rejected=Counter("batchyard_upstream_usage_rejected", "Replies whose usage was not sane non-negative "
                               "integers, counted as zero tokens, by route.", ["route"]),
        in_flight=Gauge("batchyard_requests_in_flight", "Requests being executed (upstream or on an engine), "
                        "by route.", ["route"], multiprocess_mode="livesum"),
        team_in_flight=Gauge("batchyard_team_requests_in_flight", "Requests being executed, by team and route "
                             "(the team's share of the route: this over batchyard_requests_in_flight).",
                             ["team", "route"], multiprocess_mode="livesum"),
        latency=Histogram("batchyard_request_duration_seconds", "Latency of each upstream or engine call, by route.",
                          ["route"], buckets=LATENCY_BUCKETS),
    )


def _status(result: Result) -> str:
    if result.status_code is not None:
        return str(result.status_code)
    return str((result.error or {}).get("code") or "error")


def observe_results(team: str, route: str, results: Iterable[Result]) -> None:
    """Count results just recorded (once each: call it after the Store took them)."""
    m = _metrics()
    route = route or UNROUTED
    requests: dict[str, int] = {}
    tokens_in = tokens_out = 0
    cost = 0.0
    refused = 0
    for result in results:
        status = _status(result)
        requests[status] = requests.get(status, 0) + 1
        if result.ok:
            usage = result.usage
            tokens_in += usage.input_tokens
            tokens_out += usage.output_tokens
            refused += result.usage_refused
        cost += billable(result.cost_usd)  # a Counter refuses a negative increment, and a spend never falls
    observe_statuses(team, route, requests)
    if refused:
        m.usage_rejected.labels(route).inc(refused)
        # Which route, how many; never the reply itself (it is the team's data).
        log.warning("route %s (team %s): %d replies reported a usage that is not sane non-negative integers (at "
                    "most %d tokens); counted as zero tokens", route, team, refused, MAX_USAGE_TOKENS)
    if tokens_in:
        m.tokens.labels(team, route, "input").inc(tokens_in)
    if tokens_out:
        m.tokens.labels(team, route, "output").inc(tokens_out)
    if cost:
        m.cost.labels(team, route).inc(cost)


def observe_statuses(team: str, route: str, requests: Mapping[str, int]) -> None:
    """Count results by status, without tokens or cost (lines answered at validation, tallied as the
    planner wrote them)."""
    m = _metrics()
    route = route or UNROUTED
    for status, n in requests.items():
        m.requests.labels(team, route, status).inc(n)


_OWNERS: OrderedDict[str, str] = OrderedDict()
_OWNERS_KEPT = 4096


async def team_of(store: Store, batch_id: str) -> str:
    """The team (owner) of a batch, remembered: for a call site that has only the batch id."""
    owner = _OWNERS.get(batch_id)
    if owner is None:
        batch = await store.batches.get(batch_id)
        owner = batch.owner if batch is not None else ""
        _OWNERS[batch_id] = owner
        while len(_OWNERS) > _OWNERS_KEPT:
            _OWNERS.popitem(last=False)
    return owner


class RequestMeter:
    """The in-flight gauges and the latency histogram of one route (and team), each label child looked up
    once: every backend's per-request call passes here, thousands of times a second on a local engine,
    and `labels()` (a lock, a tuple, a dict) cost more than the increment it finds."""

    __slots__ = ("_gauges", "_latency")

    def __init__(self, route: str, team: str | None = None) -> None:
        m = _metrics()
        route = route or UNROUTED
        gauges = [m.in_flight.labels(route)]
        if team is not None:
            gauges.append(m.team_in_flight.labels(team, route))
        self._gauges = tuple(gauges)
        self._latency = m.latency.labels(route)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        for gauge in self._gauges:
            gauge.inc()
        try:
            yield
        finally:
            for gauge in self._gauges:
                gauge.dec()

    def observe_latency(self, seconds: float) -> None:
        self._latency.observe(seconds)


# -- several processes ----------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_multiprocess_dir() -> None:
    """At server start: remove the value files of processes that are gone.

    A live process's files stay: a `batchyard worker` sharing the directory may
    have started first, and it keeps writing to its files.
    """
    directory = multiprocess_dir()
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for file in path.glob("*.db"):
        match = _DB_FILE.search(file.name)
        if match is None or not _alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()


def process_exited(pid: int) -> None:
    """A process of the multiprocess directory exited: drop its live gauges (its counters stay)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid)


# -- the scrape -----------------------------------------------------------------------


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


class _Forward:
    """The default registry's metrics (this process's, and a local vLLM engine's) in a scrape's registry."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


def render(shared: SharedState | None, accept: str | None) -> tuple[bytes, str]:
    """The scrape's body and content type (Prometheus text, or OpenMetrics when asked for)."""
    _metrics()  # the families exist from the first scrape on, even before anything was counted
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    directory = multiprocess_dir()
    if directory:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_as_collector(_Forward()))
    if shared is not None:
        registry.register(_as_collector(shared))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def _as_collector(obj: Any) -> Collector:
    return cast("Collector", obj)  # prometheus-client takes anything with collect()


__all__ = [
    "RequestMeter", "SharedState", "TeamState", "multiprocess_dir", "observe_results", "prepare_multiprocess_dir",
    "process_exited", "read_shared_state", "render", "team_of",
]
