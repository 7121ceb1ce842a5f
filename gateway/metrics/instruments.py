"""What each process counts, where it happens: the instruments, built on first use, and the calls that
count (results by team, route and status; tokens; cost; usage refused; requests in flight; latency).

Built lazily so that `PROMETHEUS_MULTIPROC_DIR` (`gateway.metrics.multiproc`) is read as late as possible:
prometheus-client reads it when it is first imported, and importing this module is not that moment.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.domain import MAX_USAGE_TOKENS, Result, billable
from gateway.log_safe import escaped
from gateway.metrics.multiproc import multiprocess_dir, process_exited, reserve_value_files

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

    from gateway.store.protocols import Store

log = logging.getLogger("batchyard.metrics")

UNROUTED = "unrouted"  # the route label of lines answered at validation (no route: unknown model, bad url)
# LLM calls take from tens of milliseconds (an embedding) to minutes (a long generation).
# The reasons of `batchyard_paused` and kinds of `batchyard_machine_faults_total` (`gateway.store.faults`).
FAULT_KINDS = ("disk_full", "disk_io_error", "read_only", "database_locked", "redis_unreachable", "s3_unavailable",
               "s3_unreachable")
_route_label: Callable[[str], str] | None = None  # `label_routes_by`


def label_routes_by(label: Callable[[str], str] | None) -> None:
    """How a route name becomes its `route` label in this process (`Config.metric_route`: a wildcard route's
    concrete model counts under its pattern), so the series stay bounded whatever models lines name."""
    global _route_label
    _route_label = label


def route_label(route: str) -> str:
    """The `route` label of a route name (`label_routes_by`); lines without a route are `UNROUTED`."""
    if not route:
        return UNROUTED
    return _route_label(route) if _route_label is not None else route


LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True, slots=True)
class Instruments:
    requests: Counter
    tokens: Counter
    cost: Counter
    usage_rejected: Counter
    in_flight: Gauge
    team_in_flight: Gauge
    latency: Histogram
    paused: Gauge
    machine_faults: Counter
    unpriced_tiers: Counter
    output_reruns: Counter
    output_invalid: Counter


@functools.cache
def built() -> Instruments:
    """The instruments, built on first use, so the multiprocess setting is read as late as possible."""
    directory = multiprocess_dir()
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        atexit.register(process_exited, os.getpid())
    from prometheus_client import Counter, Gauge, Histogram

    instruments = Instruments(
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
        paused=Gauge("batchyard_paused", "1 while this process's shard runner pauses for a fault of the machine "
                     "(reason: disk_full, disk_io_error, read_only, database_locked, redis_unreachable, "
                     "s3_unavailable, s3_unreachable), else 0.", ["reason"], multiprocess_mode="livemax"),
        machine_faults=Counter("batchyard_machine_faults", "Faults of the machine met by a shard or an upload, by "
                               "kind (the reasons of batchyard_paused): the shard was handed back without "
                               "spending an attempt.", ["kind"]),
        unpriced_tiers=Counter("batchyard_unpriced_tier_replies", "Replies that reported a service tier no "
                               "price is known for, billed at the highest per-token price known for their model, "
                               "by route.", ["route"]),
        output_reruns=Counter("batchyard_output_reruns", "Re-runs of requests whose reply did not match their "
                              "request's schema (attempts past the first), by team and route.", ["team", "route"]),
        output_invalid=Counter("batchyard_output_invalid", "Requests whose reply still did not match their "
                               "request's schema after their re-runs (failed: output_invalid), by team and route.",
                               ["team", "route"]),
    )
    # Every reason shown from the start (0), and their value files written now, while the disk has room.
    for kind in FAULT_KINDS:
        instruments.paused.labels(kind).set(0)
        instruments.machine_faults.labels(kind)
    reserve_value_files(os.getpid())
    return instruments


def _status(result: Result) -> str:
    if result.status_code is not None and result.error is None:
        return str(result.status_code)
    return str((result.error or {}).get("code") or "error")  # a 2xx reply failed by us: `output_invalid`


def observe_results(team: str, route: str, results: Iterable[Result]) -> None:
    """Count results just recorded (once each: call it after the Store took them)."""
    m = built()
    route = route_label(route)
    requests: dict[str, int] = {}
    tokens_in = tokens_out = 0
    cost = 0.0
    refused = reruns = invalid = 0
    for result in results:
        reruns += result.reruns
        status = _status(result)
        invalid += status == "output_invalid"
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
                    "most %d tokens); counted as zero tokens", escaped(route), escaped(team), refused, MAX_USAGE_TOKENS)
    if reruns:
        m.output_reruns.labels(team, route).inc(reruns)
    if invalid:
        m.output_invalid.labels(team, route).inc(invalid)
    if tokens_in:
        m.tokens.labels(team, route, "input").inc(tokens_in)
    if tokens_out:
        m.tokens.labels(team, route, "output").inc(tokens_out)
    if cost:
        m.cost.labels(team, route).inc(cost)


def observe_statuses(team: str, route: str, requests: Mapping[str, int]) -> None:
    """Count results by status, without tokens or cost (lines answered at validation, tallied as the
    planner wrote them)."""
    m = built()
    route = route_label(route)
    for status, n in requests.items():
        m.requests.labels(team, route, status).inc(n)


def prepare_instruments() -> None:
    """Build the instruments and write this process's value files at its start, while the disk has room:
    built first during a full disk, they would kill the process (`reserve_value_files`)."""
    built()


def observe_machine_fault(kind: str) -> None:
    """Count one fault of the machine (`gateway.store.faults`) met by this process."""
    built().machine_faults.labels(kind).inc()


def observe_unpriced_tier(route: str) -> None:
    """One reply reported a tier with no known price (billed at the model's highest known price)."""
    built().unpriced_tiers.labels(route_label(route)).inc()


def set_paused(reason: str, paused: bool) -> None:
    """This process's runner pauses (or no longer) for a fault of the machine of that reason."""
    built().paused.labels(reason).set(1 if paused else 0)


@dataclass(frozen=True, slots=True)
class PacingGauges:
    """A `batch_mode: background` route's pacing (`providers.background`), by route."""

    allowed: Gauge
    in_flight: Gauge
    server_waiting: Gauge
    metrics_up: Gauge


@functools.cache
def pacing_gauges() -> PacingGauges:
    """Built on a background route's first step (a config without one shows none of them)."""
    built()
    from prometheus_client import Gauge

    gauges = PacingGauges(
        allowed=Gauge("batchyard_background_allowed_concurrency", "A batch_mode: background route's allowed "
                      "concurrency on its server (every worker's requests together), by route.", ["route"],
                      multiprocess_mode="livemax"),
        in_flight=Gauge("batchyard_background_concurrency", "A batch_mode: background route's requests in flight, "
                        "by route.", ["route"], multiprocess_mode="livesum"),
        server_waiting=Gauge("batchyard_background_server_waiting", "The server's vllm:num_requests_waiting for "
                             "a background route's model, as last read, by route.", ["route"],
                             multiprocess_mode="livemax"),
        metrics_up=Gauge("batchyard_background_metrics_up", "1 while a background route's server /metrics can be "
                         "read, 0 while it runs at its low fixed concurrency instead, by route.", ["route"],
                         multiprocess_mode="livemin"),
    )
    reserve_value_files(os.getpid())
    return gauges


def set_pacing(route: str, *, allowed: int, in_flight: int, waiting: int | None, metrics_up: bool) -> None:
    """A background route's pacing after a step (`waiting`: None when /metrics was not read)."""
    gauges = pacing_gauges()
    gauges.allowed.labels(route).set(allowed)
    gauges.in_flight.labels(route).set(in_flight)
    if waiting is not None:
        gauges.server_waiting.labels(route).set(waiting)
    gauges.metrics_up.labels(route).set(1 if metrics_up else 0)


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


_METER_FILES_RESERVED = False


class RequestMeter:
    """The in-flight gauges and the latency histogram of one route (and team), each label child looked up
    once: every backend's per-request call passes here, thousands of times a second on a local engine,
    and `labels()` (a lock, a tuple, a dict) cost more than the increment it finds."""

    __slots__ = ("_gauges", "_latency")

    def __init__(self, route: str, team: str | None = None) -> None:
        m = built()
        route = route_label(route)
        gauges = [m.in_flight.labels(route)]
        if team is not None:
            gauges.append(m.team_in_flight.labels(team, route))
        self._gauges = tuple(gauges)
        self._latency = m.latency.labels(route)
        global _METER_FILES_RESERVED
        if not _METER_FILES_RESERVED:  # the first meter made the in-flight and latency files: reserve them too
            _METER_FILES_RESERVED = True
            reserve_value_files(os.getpid())

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


__all__ = [
    "FAULT_KINDS",
    "LATENCY_BUCKETS",
    "UNROUTED",
    "Instruments",
    "PacingGauges",
    "RequestMeter",
    "built",
    "label_routes_by",
    "observe_machine_fault",
    "observe_results",
    "observe_statuses",
    "observe_unpriced_tier",
    "pacing_gauges",
    "prepare_instruments",
    "route_label",
    "set_pacing",
    "set_paused",
    "team_of",
]
