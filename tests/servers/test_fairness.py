"""Teams share one gateway fairly, in both modes (real processes: `batchyard serve` embedded with a worker
process, and `batchyard serve --redis-url … --with-worker` over a real redis-server; the loopback upstream
answers each line after the `#sleep` it carries, the OpenAI SDK is the client).

- A small batch beside another team's large one runs at once, not behind the large one's shards.
- Weights: a weight-2 team gets twice the requests of a weight-1 team while both have work (±20%).
- EDF within a team: a batch with a sooner `expires_at` runs first, even when submitted second.
- A team alone on a route gets all of it: every request slot in use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, submit
from tests.support.team_helpers import MODEL, MODES, metric, serve
from tests.support.team_helpers import done as _done
from tests.support.team_helpers import finished as _finished
from tests.support.team_helpers import lines as _lines
from tests.support.team_helpers import until as _until

SLOTS = 6  # max_concurrency: the request slots a worker process divides between the teams
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]},
         {"team_id": "gamma", "api_keys": ["sk-gamma"], "weight": 2}]


def _config(upstream: Upstream) -> dict[str, Any]:
    return gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key="sk-admin", shard_size=30,
                          max_concurrency=SLOTS, max_shards_in_flight=4, completion_windows={"1h": 3600})


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve(request.param, _config(upstream), tmp_path_factory.mktemp(request.param) / "data") as server:
        yield server


def test_a_small_batch_runs_beside_another_teams_large_one(gateway: Gateway) -> None:
    big = submit(gateway.client("sk-alpha"), _lines(360, "big"))  # 12 shards: ~12 s at 6 slots
    _until(gateway, "sk-alpha", big.id, lambda b: _done(b) >= 30)
    started = time.monotonic()
    small = submit(gateway.client("sk-beta"), _lines(6, "small"))
    small_done = _until(gateway, "sk-beta", small.id, _finished)
    waited = time.monotonic() - started
    big_now = gateway.client("sk-alpha").batches.retrieve(big.id)
    assert small_done.status == "completed"
    # Behind alpha's queued shards, beta would finish with alpha: it finished while most of alpha waits.
    assert not _finished(big_now) and _done(big_now) < 360 * 0.6, (waited, big_now.request_counts)
    gateway.client("sk-alpha").batches.cancel(big.id)
    _until(gateway, "sk-alpha", big.id, _finished)


def test_weights_divide_the_route_two_to_one(gateway: Gateway) -> None:
    heavy = submit(gateway.client("sk-gamma"), _lines(240, "heavy"))  # weight 2
    light = submit(gateway.client("sk-beta"), _lines(240, "light"))  # weight 1
    _until(gateway, "sk-beta", light.id, lambda b: _done(b) >= 10)
    first = (_done(gateway.client("sk-gamma").batches.retrieve(heavy.id)),
             _done(gateway.client("sk-beta").batches.retrieve(light.id)))
    _until(gateway, "sk-gamma", heavy.id, lambda b: _done(b) >= first[0] + 90 or _finished(b))
    last = (_done(gateway.client("sk-gamma").batches.retrieve(heavy.id)),
            _done(gateway.client("sk-beta").batches.retrieve(light.id)))
    ratio = (last[0] - first[0]) / max(1, last[1] - first[1])
    assert 1.6 <= ratio <= 2.4, (first, last, ratio)
    gateway.client("sk-gamma").batches.cancel(heavy.id)
    gateway.client("sk-beta").batches.cancel(light.id)
    _until(gateway, "sk-gamma", heavy.id, _finished)
    _until(gateway, "sk-beta", light.id, _finished)


def test_within_a_team_the_sooner_deadline_runs_first(gateway: Gateway) -> None:
    client = gateway.client("sk-alpha")
    later = submit(client, _lines(240, "later"))  # 24h; its shards fill the worker's shard slots
    _until(gateway, "sk-alpha", later.id, lambda b: _done(b) >= 6)
    sooner = submit(client, _lines(60, "sooner"), completion_window="1h")
    _until(gateway, "sk-alpha", sooner.id, lambda b: _done(b) >= 1)
    before = _done(client.batches.retrieve(later.id))
    sooner_done = _until(gateway, "sk-alpha", sooner.id, _finished)
    after = client.batches.retrieve(later.id)
    assert sooner_done.status == "completed"
    # While the sooner batch ran, the later one got only what it left (slots between its shards).
    assert not _finished(after) and _done(after) - before < 60 / 2, (before, after.request_counts)
    client.batches.cancel(later.id)
    _until(gateway, "sk-alpha", later.id, _finished)


def _in_flight(gw: Gateway) -> float:
    return metric(gw, "batchyard_team_requests_in_flight", team="beta", route=MODEL) or 0.0


def test_a_team_alone_gets_the_whole_route(gateway: Gateway) -> None:
    alone = submit(gateway.client("sk-beta"), _lines(90, "alone", sleep_ms=300))
    seen = 0.0
    while not _finished(batch := gateway.client("sk-beta").batches.retrieve(alone.id)):
        seen = max(seen, _in_flight(gateway))
        time.sleep(0.02)
    assert batch.status == "completed"
    assert seen == SLOTS  # work-conserving: no slot kept back for teams with no work (beta's share: all of it)
