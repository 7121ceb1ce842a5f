"""Redis faults in shared mode lose nothing and fail no line.

Shared mode as deployed: an API replica (`serve --redis-url`, no routes) and two `batchyard worker`s, over a
redis-server with `appendonly yes`, a batch of many shards running on the loopback upstream.

- Redis killed (SIGKILL) mid-batch and started again on the same port from its append-only file.
- Redis unreachable (connections refused: a proxy in front of it closes) for longer than the workers'
  `--claim-idle`, so every claim looks abandoned when it comes back, then reachable again.

Either way the batch completes with every custom_id once in the merged output and error files, no line
failed, the API answered every request during the fault (a 200, or a 503 in OpenAI's error shape: never a
5xx of another kind, never a dropped connection), and no traceback in the API's or the workers' logs.
"""

from __future__ import annotations

import itertools
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fault_proxy import FaultProxy
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, read_jsonl, submit
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer, WorkerProcess, start_worker
from tests.support.team_helpers import done, finished, start_shared, until

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
LINES = 600
CLAIM_IDLE = 1.0  # seconds: the workers' --claim-idle, short so that the outage outlasts it


class Shared:
    """The API replica and two workers over `redis_url`."""

    def __init__(self, upstream: Upstream, tmp: Path, redis_url: str) -> None:
        config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, shard_size=25)
        self.gw: Gateway = start_shared(config, tmp / "data", redis_url, with_worker=False)
        storage = str(tmp / "data" / "blobs")
        config_path = tmp / "shared.config.yaml"
        self.workers: list[WorkerProcess] = []
        for _ in range(2):
            self.workers.append(start_worker(config_path, redis_url, storage, claim_idle=CLAIM_IDLE))
        for worker in self.workers:
            worker.wait_ready(120)

    def logs(self) -> str:
        return "\n".join([self.gw.log(), *(w.log() for w in self.workers)])

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.gw.stop()


def answer(gw: Gateway) -> int:
    """Team beta's GET /v1/batches: its status (a 503 must carry OpenAI's error shape); no reply fails the test."""
    reply = httpx.get(gw.url + "/v1/batches?limit=5", headers={"Authorization": "Bearer sk-beta"}, timeout=60)
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}, reply.text
    return reply.status_code


def run_through(shared: Shared, fault: Any, clear: Any) -> None:
    """A batch running; `fault()` once some lines are done; `clear()` after the outage; the batch checked."""
    lines = [chat_line(f"r-{i}", "gpt-mini", f"#sleep:20 line {i}") for i in range(LINES)]
    alpha = shared.gw.client("sk-alpha")
    batch_id = submit(alpha, lines).id
    until(shared.gw, "sk-alpha", batch_id, lambda b: done(b) >= 50, timeout=90)
    fault()
    outage = time.monotonic() + 4 * CLAIM_IDLE  # the outage lasts past every claim's idle time
    assert answer(shared.gw) in (200, 503)
    time.sleep(max(0.0, outage - time.monotonic()))  # the fault's length, not a wait for a condition
    clear()
    batch = until(shared.gw, "sk-alpha", batch_id, finished, timeout=180)
    assert batch.status == "completed", shared.logs()[-4000:]
    output = [r["custom_id"] for r in read_jsonl(alpha, batch.output_file_id)]
    errors = read_jsonl(alpha, batch.error_file_id)
    assert errors == [], errors[:5]
    assert sorted(output) == sorted(line["custom_id"] for line in lines)  # each once: none lost, none twice
    assert batch.request_counts is not None and batch.request_counts.completed == LINES
    logs = shared.logs()
    assert tracebacks(logs) == [], "\n".join(tracebacks(logs))
    assert all(w.alive() for w in shared.workers), logs[-4000:]


def tracebacks(log: str) -> list[str]:
    """Each traceback in `log`, as its last frame in our code and the error: where an expected fault leaked."""
    found = []
    chained = re.sub(r"\n\s*(During handling of the above exception, another exception occurred|The above "
                     r"exception was the direct cause of the following exception):\s*\n\s*Traceback \(most recent "
                     r"call last\):", "\n", log)
    pieces = chained.split("Traceback (most recent call last):")
    for before, block in itertools.pairwise(pieces):
        logged = before.rstrip().rsplit("\n", 1)[-1][-120:]  # the log line the traceback came with
        ours = re.findall(r'File "[^"]*/((?:gateway|providers|local_engine)/[^"]+)", line (\d+), in (\w+)', block)
        errors = [line.strip() for line in block.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception)\b", line)]
        error = errors[-1] if errors else "?"
        found.append(f"{logged!r} at {':'.join(ours[-1]) if ours else '(library only)'}: {error[:100]}")
    return sorted(set(found))


@pytest.fixture
def redis_aof() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True).start()
    yield server
    server.close()


def test_redis_killed_and_restarted_from_its_aof_loses_nothing(
    upstream: Upstream, tmp_path: Path, redis_aof: RedisServer
) -> None:
    shared = Shared(upstream, tmp_path, redis_aof.url)
    try:
        run_through(shared, lambda: redis_aof.stop(signal.SIGKILL), redis_aof.start)
    finally:
        shared.close()


def test_redis_unreachable_past_claim_idle_loses_nothing(
    upstream: Upstream, tmp_path: Path, redis_aof: RedisServer
) -> None:
    with FaultProxy("127.0.0.1", redis_aof.port) as proxy:
        shared = Shared(upstream, tmp_path, f"redis://127.0.0.1:{proxy.port}/0")
        try:
            def refuse() -> None:
                proxy.mode = "refuse"

            def reopen() -> None:
                proxy.mode = "pass"

            run_through(shared, refuse, reopen)
        finally:
            shared.close()


def test_the_api_answers_while_redis_is_down(upstream: Upstream, tmp_path: Path, redis_aof: RedisServer) -> None:
    """No batch needed: with Redis gone, a GET is a 503 in OpenAI's shape, at once, and a 200 once it is back."""
    shared = Shared(upstream, tmp_path, redis_aof.url)
    try:
        redis_aof.stop(signal.SIGKILL)
        assert answer(shared.gw) == 503
        redis_aof.start()
        assert until_ok(shared.gw)
    finally:
        shared.close()


def until_ok(gw: Gateway) -> bool:
    from tests.support.waiting import eventually

    return eventually(lambda: httpx.get(gw.url + "/v1/batches", headers={"Authorization": "Bearer sk-beta"},
                                        timeout=10).status_code == 200, 30, "the API back on Redis")
