"""Prometheus metrics, through `prometheus-client`: one module per concept.

- `gateway.metrics.instruments`: what each process counts (the counters, gauges
  and the latency histogram, built on first use) and the calls that count.
- `gateway.metrics.multiproc`: the multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`)
  that the processes of one machine share.
- `gateway.metrics.shared_state`: the gauges of shared state, read from the
  Store and the Queue at scrape time.
- `gateway.metrics.exposition`: one scrape's body (`render`).

Callers use this package's surface (`from gateway import metrics`,
`metrics.observe_results(...)`); the names below are all it offers.

What is counted where it happens (any process: the API, a `batchyard worker`,
an embedded worker process):
- `batchyard_requests_total{team, route, status}`: results recorded (status is
  the HTTP status, or the error code of a request that never ran);
- `batchyard_tokens_total{team, route, type}`: input and output tokens of
  successful results;
- `batchyard_cost_usd_total{team, route}`: what those results cost;
- `batchyard_upstream_usage_rejected_total{route}`: successful results whose reply's `usage`
  was not sane non-negative integers (`gateway.domain.Usage.read`): counted as zero tokens and cost;
- `batchyard_requests_in_flight{route}`: requests being executed right now;
- `batchyard_team_requests_in_flight{team, route}`: the same by team (its share
  of the route is this over the route's total);
- `batchyard_request_duration_seconds{route}`: upstream/engine latency of each call.
- `batchyard_background_allowed_concurrency{route}`, `batchyard_background_concurrency{route}`,
  `batchyard_background_server_waiting{route}`, `batchyard_background_metrics_up{route}`: a `batch_mode:
  background` route's pacing on its shared server (`providers.background`);
- `batchyard_unpriced_tier_replies_total{route}`: replies that reported a service tier no price is known
  for, billed at the highest per-token price known for their model (a warning: add the tier's price).

The `route` label is the route's model_name; a wildcard route's concrete models count under its pattern
(`openai/*`), except a model the config names (a team's `models` or limits), so series stay bounded
whatever models lines name (`label_routes_by`, `Config.metric_route`).
- `batchyard_paused{reason}`: 1 while a shard runner pauses for a fault of the machine (a full disk, the
  store, Redis or S3 down), by reason; `batchyard_machine_faults_total{kind}`: those faults, counted.

What describes shared state (`batchyard_queue_depth{route}`, `batchyard_batches{status}`,
and per team `batchyard_team_requests_queued`, `batchyard_team_active_batches`,
`batchyard_team_weight`, `batchyard_team_quota_headroom{quota}`,
`batchyard_team_spend_usd` and `batchyard_team_max_budget_usd`)
is read from the Queue and the Store at scrape time by `SharedState`, so every API
replica reports the same truth and nothing is summed across processes.

Several processes on one machine share one scrape through the multiprocess
directory (`gateway.metrics.multiproc`).
"""

from __future__ import annotations

from gateway.metrics.exposition import render
from gateway.metrics.instruments import (
    RequestMeter,
    label_routes_by,
    observe_machine_fault,
    observe_results,
    observe_statuses,
    observe_unpriced_tier,
    prepare_instruments,
    set_pacing,
    set_paused,
    team_of,
)
from gateway.metrics.multiproc import MULTIPROC_ENV, multiprocess_dir, prepare_multiprocess_dir, process_exited
from gateway.metrics.shared_state import SharedState, TeamState, read_shared_state

__all__ = [
    "MULTIPROC_ENV", "RequestMeter", "SharedState", "TeamState", "label_routes_by", "multiprocess_dir",
    "observe_machine_fault", "observe_results", "observe_statuses", "observe_unpriced_tier", "prepare_instruments",
    "prepare_multiprocess_dir", "process_exited", "read_shared_state", "render", "set_pacing", "set_paused", "team_of",
]
