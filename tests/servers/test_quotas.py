"""Team quotas, in both modes (real processes, the OpenAI SDK as client): a batch over a quota is refused at
create with 429, OpenAI's error shape and a code naming the quota; nothing of it is stored; the place frees
once the team's batches finish.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, submit
from tests.support.team_helpers import MODEL, MODES, finished, lines, metric, serve, until

TEAMS = [{"team_id": "one-at-a-time", "api_keys": ["sk-one"], "max_active_batches": 1},
         {"team_id": "ten-requests", "api_keys": ["sk-ten"], "max_enqueued_requests": 10}]


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, shard_size=10, max_concurrency=8,
                            master_key="sk-admin")
    with serve(request.param, config, tmp_path_factory.mktemp(request.param) / "data") as server:
        yield server


def _refused(gw: Gateway, key: str, batch_lines: list[dict[str, Any]]) -> dict[str, Any]:
    with pytest.raises(openai.RateLimitError) as caught:
        submit(gw.client(key), batch_lines)  # the client retries nothing
    assert caught.value.status_code == 429
    body = caught.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_max_active_batches_is_refused_with_its_code_until_a_batch_finishes(gateway: Gateway) -> None:
    client = gateway.client("sk-one")
    first = submit(client, lines(4, "first", sleep_ms=1500))
    error = _refused(gateway, "sk-one", lines(2, "second"))
    assert error["code"] == "max_active_batches_exceeded" and error["type"] == "rate_limit_error"
    assert "Limit: 1 active batches" in error["message"]
    assert [b.id for b in client.batches.list().data] == [first.id]  # the refused batch was never stored
    assert metric(gateway, "batchyard_team_quota_headroom", team="one-at-a-time", quota="max_active_batches") == 0
    assert metric(gateway, "batchyard_team_active_batches", team="one-at-a-time") == 1
    assert until(gateway, "sk-one", first.id, finished).status == "completed"
    # The sweep frees the finished batch's place (every second embedded, every 5 s shared).
    third = None
    deadline = time.monotonic() + 20
    while third is None and time.monotonic() < deadline:
        try:
            third = submit(client, lines(2, "third", sleep_ms=0))
        except openai.RateLimitError:
            time.sleep(0.2)
    assert third is not None
    assert until(gateway, "sk-one", third.id, finished).status == "completed"


def test_max_enqueued_requests_is_refused_with_its_code(gateway: Gateway) -> None:
    error = _refused(gateway, "sk-ten", lines(11, "eleven"))
    assert error["code"] == "max_enqueued_requests_exceeded"
    assert "Limit: 10 enqueued requests" in error["message"]
    client = gateway.client("sk-ten")
    six = submit(client, lines(6, "six", sleep_ms=1500))
    assert _refused(gateway, "sk-ten", lines(5, "five"))["code"] == "max_enqueued_requests_exceeded"
    four = submit(client, lines(4, "four", sleep_ms=0))  # 6 + 4 fit exactly
    for batch in (six, four):
        assert until(gateway, "sk-ten", batch.id, finished).status == "completed"
