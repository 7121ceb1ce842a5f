"""S3 throttling (503 SlowDown) or unreachable mid-batch pauses the batch; it resumes by itself when S3 is back.

`batchyard serve --redis-url … --blobs s3://…` reaches moto's S3 through a fault-injecting proxy
(`tests/fakes/fault_proxy.py`). Once the batch is running the proxy answers every request 503 `SlowDown` (S3's
XML error shape), or refuses connections, until the runner has paused. The rule: the shards that meet the fault
are handed back without spending an attempt, `batchyard_paused{reason=…}` is 1 and
`batchyard_machine_faults_total{kind=…}` counts, the dashboard says "waiting: S3 unreachable since 10:02 UTC",
the API keeps answering `GET /v1/batches` (the records are in Redis), and when the proxy passes again the batch
completes on its own: every custom_id once, no line failed, no traceback in the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fault_proxy import FaultProxy, Mode
from tests.fakes.upstream.server import Upstream
from tests.support.fault_checks import assert_every_line_once, assert_no_traceback, log_tail, logs, metric
from tests.support.server_helpers import chat_line, gateway_config, submit, wait_batch
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, MotoS3, RedisServer
from tests.support.team_helpers import start_shared
from tests.support.waiting import eventually

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]


@pytest.fixture
def proxy(s3: MotoS3) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", s3.port) as server:
        yield server


@pytest.mark.parametrize(("mode", "reason", "words"), [
    ("slowdown", "s3_unavailable", "S3 unavailable (throttled or 5xx: "),
    ("refuse", "s3_unreachable", "S3 unavailable (unreachable: "),
])
def test_an_s3_outage_pauses_the_batch_and_it_resumes_when_s3_is_back(
    mode: Mode, reason: str, words: str, upstream: Upstream, redis_server: RedisServer, s3: MotoS3,
    proxy: FaultProxy, tmp_path: Path,
) -> None:
    config = gateway_config(upstream, models=("gpt-mini",), shard_size=10, max_shards_in_flight=1)
    ids = [f"line-{i}" for i in range(150)]
    env = {**s3.env(), "BATCHYARD_S3_ENDPOINT_URL": proxy.url}
    with start_shared(config, tmp_path / "data", redis_server.url, blobs=s3.location(f"faults-{mode}"),
                      env=env) as gw:
        client = gw.client(None)
        batch = submit(client, [chat_line(i, "gpt-mini", f"{i} #sleep:150") for i in ids])
        eventually(lambda: (client.batches.retrieve(batch.id).request_counts or batch).completed >= 30, 60,
                   "the batch under way")

        proxy.mode = mode
        try:
            eventually(lambda: metric(gw, "batchyard_paused", reason=reason) == 1.0, 90,
                       f"batchyard_paused{{reason={reason}}}", detail=lambda: log_tail(gw))
            assert metric(gw, "batchyard_machine_faults_total", kind=reason) >= 1
            eventually(lambda: f"waiting: S3 {words.split('(')[1].rstrip(': ')} since " in
                       gw.http("GET", "/ui/api/batches").json()["cards"][batch.id], 60, "the dashboard's word")
            assert gw.http("GET", "/v1/batches").status_code == 200  # the API answers from Redis
            assert client.batches.retrieve(batch.id).status == "in_progress"
        finally:
            proxy.mode = "pass"

        wait_batch(client, batch.id, timeout=180)
        assert_every_line_once(client, batch.id, ids)
        eventually(lambda: metric(gw, "batchyard_paused", reason=reason) == 0.0, 30, "the pause over")
        text = logs(gw)
        assert words in text and "; pausing, retry in " in text, log_tail(gw)
        assert "S3 available again (" in text
        assert "giving up" not in text and "failed; handing it back" not in text
        assert_no_traceback(gw)
