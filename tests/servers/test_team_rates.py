"""A team's rate limits and per-model quota, in both modes, with two worker processes sharing one limit (real
processes: the gateway, its workers, redis-server in the shared mode, the loopback upstream; the OpenAI SDK as
client).

- `model_rpm_limit` / `rpm_limit`: the team's requests on a route are paced to the limit per window (the
  store's counter, shared by both workers: neither may start the other's share); the team's other route and
  other teams are not held back; nothing is refused.
- `tpm_limit`: paced by the tokens the results report.
- `model_max_enqueued_requests`: a batch over the team's per-model quota is refused at create with 429
  `model_max_enqueued_requests_exceeded`; other models' lines do not count against it.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, read_jsonl, start_gateway, submit
from tests.support.services import RedisServer, start_worker
from tests.support.team_helpers import MODEL, MODES, finished, lines, metric, start_shared, until

OTHER = "gpt-azure"  # the paced team's other route
RPM, TPM = 5, 21  # per window of 1 s; a line is 3 + 4 = 7 tokens: 3 lines per window
TEAMS = [
    {"team_id": "paced", "api_keys": ["sk-paced"], "model_rpm_limit": {MODEL: RPM}},
    {"team_id": "tokens", "api_keys": ["sk-tokens"], "tpm_limit": TPM},
    {"team_id": "free", "api_keys": ["sk-free"]},
    {"team_id": "models", "api_keys": ["sk-models"], "model_max_enqueued_requests": {MODEL: 5}},
]


@contextlib.contextmanager
def two_workers(mode: str, config: dict[str, Any], data_dir: Path) -> Iterator[Gateway]:
    """The gateway with two worker processes: embedded `--workers 2`, or shared `--with-worker` plus a
    `batchyard worker` over one redis-server."""
    if mode == "embedded":
        with start_gateway(config, data_dir, workers=2) as gateway:
            yield gateway
        return
    redis = RedisServer().start()
    try:
        with start_shared(config, data_dir, redis.url) as gateway:
            worker = start_worker(data_dir.parent / "shared.config.yaml", redis.url, str(data_dir / "blobs"))
            try:
                worker.wait_ready()
                yield gateway
            finally:
                worker.close()
    finally:
        redis.close()


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # One shard in flight per worker: both workers run the paced batch's shards at once.
    config = gateway_config(upstream, models=(MODEL, OTHER), teams=TEAMS, shard_size=5, max_shards_in_flight=1,
                            rate_window_seconds=1, master_key="sk-admin")
    with two_workers(request.param, config, tmp_path_factory.mktemp(request.param) / "data") as server:
        # Both routes warmed in both workers (LiteLLM's first call in a process takes seconds), so timings
        # below measure pacing, not start-up.
        warm = submit(server.client("sk-free"), lines(20, "warm", sleep_ms=0) + [_on(x, OTHER) for x in
                                                                                 lines(20, "warm-az", sleep_ms=0)])
        assert until(server, "sk-free", warm.id, finished).status == "completed"
        yield server


def _on(line: dict[str, Any], model: str) -> dict[str, Any]:
    return {**line, "body": {**line["body"], "model": model}}


def _seconds(gw: Gateway, key: str, batch_id: str) -> Counter[int]:
    """How many of the batch's requests the upstream answered in each second (its replies' `created`)."""
    done = until(gw, key, batch_id, finished, timeout=90)
    assert done.status == "completed" and done.request_counts is not None, done
    assert done.request_counts.failed == 0, done.request_counts
    out = read_jsonl(gw.client(key), done.output_file_id)
    return Counter(int(o["response"]["body"]["created"]) for o in out)


def _assert_paced(per_second: Counter[int], total: int, limit: int) -> None:
    """`total` requests paced at `limit` per store window of 1 s, read from the seconds the upstream answered in.

    A request granted near a window's end is answered in the next second, so one second may hold a window's
    grants and the next one's; over any k consecutive seconds there are at most k + 1 windows' worth (plus one
    request of slack). The grants span ceil(total / limit) windows, so the answers span at least one second
    fewer. Two workers that each allowed `limit` alone would break both bounds."""
    assert sum(per_second.values()) == total, per_second
    first, last = min(per_second), max(per_second)
    assert last - first + 1 >= -(-total // limit) - 1, per_second
    for start in range(first, last + 1):
        for end in range(start, last + 1):
            run = sum(per_second.get(s, 0) for s in range(start, end + 1))
            assert run <= (end - start + 2) * limit + 1, (start, end, per_second)


def test_rpm_is_paced_across_two_workers_and_holds_back_nobody_else(gateway: Gateway) -> None:
    paced = gateway.client("sk-paced")
    started = time.monotonic()
    batch = submit(paced, lines(25, "rpm", sleep_ms=0))
    until(gateway, "sk-paced", batch.id, lambda b: b.status == "in_progress")
    # While it is paced: the team's other route and another team on the same route go at full speed.
    other_route = submit(paced, [_on(x, OTHER) for x in lines(10, "other-route", sleep_ms=0)])
    other_team = submit(gateway.client("sk-free"), lines(10, "other-team", sleep_ms=0))
    for key, b in (("sk-paced", other_route), ("sk-free", other_team)):
        assert until(gateway, key, b.id, finished, timeout=10).status == "completed"
    assert time.monotonic() - started < 4.0, "the others waited for the paced batch"
    per_second = _seconds(gateway, "sk-paced", batch.id)
    # 25 lines at 5 a window take 5 windows; the two workers share one counter (each alone would allow 5,
    # together 10).
    _assert_paced(per_second, 25, RPM)
    assert time.monotonic() - started >= 3.0


def test_tpm_is_paced_by_the_tokens_results_report(gateway: Gateway) -> None:
    batch = submit(gateway.client("sk-tokens"), lines(15, "tpm", sleep_ms=0))
    per_second = _seconds(gateway, "sk-tokens", batch.id)
    # 7 tokens a line, 21 a window: 3 lines a window once the estimate has learned (the first window's guess
    # is the body's size / 4, higher), so 15 lines take at least 5 windows.
    _assert_paced(per_second, 15, TPM // 7)


def _refused(gw: Gateway, key: str, batch_lines: list[dict[str, Any]]) -> dict[str, Any]:
    with pytest.raises(openai.RateLimitError) as caught:
        submit(gw.client(key), batch_lines)
    body = caught.value.response.json()
    assert caught.value.status_code == 429 and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_model_max_enqueued_requests_is_refused_with_its_code(gateway: Gateway) -> None:
    error = _refused(gateway, "sk-models", lines(6, "six"))
    assert error["code"] == "model_max_enqueued_requests_exceeded" and error["type"] == "rate_limit_error"
    assert f"Enqueued request limit reached for {MODEL}" in error["message"] and "Limit: 5" in error["message"]
    client = gateway.client("sk-models")
    # 4 of the limited model and 6 of another: only the 4 count against the model's quota.
    mixed = submit(client, lines(4, "four", sleep_ms=1500) + [_on(x, OTHER) for x in lines(6, "az", sleep_ms=0)])
    assert metric(gateway, "batchyard_team_quota_headroom", team="models",
                  quota=f"model_max_enqueued_requests:{MODEL}") == 1
    assert _refused(gateway, "sk-models", lines(2, "two"))["code"] == "model_max_enqueued_requests_exceeded"
    fits = submit(client, lines(1, "one", sleep_ms=0) + [_on(x, OTHER) for x in lines(9, "az2", sleep_ms=0)])
    assert [b.id for b in client.batches.list().data] == [fits.id, mixed.id]  # refused ones were never stored
    for b in (mixed, fits):
        assert until(gateway, "sk-models", b.id, finished).status == "completed"
