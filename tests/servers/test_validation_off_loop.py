"""One team's upload never stalls another team's API calls: the API's runtime validates a new batch in a
process of its own (`gateway.runtime.validation_processes`), which reads the file from the blobs and writes the
shards there, so another team's `GET /v1/batches` is answered promptly meanwhile, in both modes. A
validation process that dies mid-file leaves its batch to the sweeper, which validates it again. A Message
Batch create's body is read in the same processes: one that dies mid-read is replaced and the body read again.
Real processes: `batchyard serve` (embedded; shared over redis-server and moto's S3), the OpenAI SDK, httpx.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, MotoS3, RedisServer
from tests.support.team_helpers import MODEL, finished, start_shared, until
from tests.support.waiting import eventually

LINES = 100_000
TEAMS = [{"team_id": "big", "api_keys": ["sk-big"]}, {"team_id": "small", "api_keys": ["sk-small"]}]


def _big_file(lines: int = LINES) -> bytes:
    line = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hello there, how are you today?"}]}}
    rows = [json.dumps({**line, "custom_id": f"r{i}"}) for i in range(lines - 1)]
    rows.append("{not json")  # the last line fails the (strict) batch: validated in full, never run
    return ("\n".join(rows) + "\n").encode()


def _start_shared_s3(config: dict[str, Any], data_dir: Path, redis_url: str, s3: MotoS3) -> Gateway:
    """`batchyard serve --redis-url … --storage s3://…` (an API replica with its worker) over moto's S3."""
    return start_shared(config, data_dir, redis_url, storage=s3.storage(data_dir.parent.name), env=s3.env())


def _assert_failed_at_the_last_line(batch: Batch, lines: int = LINES) -> None:
    """The line-numbered error of the file's bad last line, as validating in place gave it."""
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data is not None
    [error] = batch.errors.data
    assert (error.code, error.line, error.param) == ("invalid_json_line", lines, None)
    assert error.message is not None and error.message.startswith("This line is not parseable as valid JSON.")


class Prober:
    """Another team's `GET /v1/batches` through the SDK, again and again: (sent at, seconds to answer)."""

    def __init__(self, client: OpenAI) -> None:
        self._client = client
        self.probes: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            assert self._client.batches.list(limit=5).object == "list"
            self.probes.append((sent, time.monotonic() - sent))
            time.sleep(0.01)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _validate_while_probing(gw: Gateway) -> tuple[Batch, float, list[float]]:
    """The big team's batch validated while the small team lists its batches: the finished batch, how long
    it was seen `validating`, and the seconds each GET took that was answered while it still was."""
    big, small = gw.client("sk-big"), gw.client("sk-small")
    source = big.files.create(file=("big.jsonl", _big_file()), purpose="batch")
    with Prober(small) as prober:
        time.sleep(0.3)  # the prober's connection is open: what follows is the validation's doing
        created = time.monotonic()
        batch = big.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        seen_validating = created
        while (batch := big.batches.retrieve(batch.id)).status == "validating":
            seen_validating = time.monotonic()  # the file was still validating when this poll was answered
            time.sleep(0.05)
    answered = [took for sent, took in prober.probes if sent >= created and sent + took <= seen_validating]
    return until(gw, "sk-big", batch.id, finished, timeout=60), seen_validating - created, answered


def _assert_prompt(validating: float, answered: list[float]) -> None:
    # Another team's GETs came back while the file was still validating, in a small part of the time it took.
    # On the loop a GET waited out the whole validation (5 s for 500k lines); in a thread it waited for the
    # GIL. The bounds are loose for a loaded 2-core CI machine (the median, and no GET near the whole
    # validation): bench/server_load.py --validation-only measures the figure (p99 <= 50 ms is the aim).
    assert len(answered) >= 5, (len(answered), validating)
    assert statistics.median(answered) < min(0.25, validating / 8), (statistics.median(answered), validating)
    assert max(answered) < validating / 2, (max(answered), validating)


def test_another_teams_get_is_answered_promptly_while_a_large_file_validates(
    upstream: Upstream, tmp_path: Path
) -> None:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=LINES, max_file_bytes=64 << 20)
    with start_gateway(config, tmp_path / "data") as gw:
        batch, validating, answered = _validate_while_probing(gw)
        _assert_failed_at_the_last_line(batch)
        _assert_prompt(validating, answered)


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_shared_mode_another_teams_get_is_answered_promptly_while_a_large_file_validates_from_s3(
    upstream: Upstream, redis_server: RedisServer, s3: MotoS3, tmp_path: Path
) -> None:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=LINES, max_file_bytes=64 << 20)
    with _start_shared_s3(config, tmp_path / "data", redis_server.url, s3) as gw:
        batch, validating, answered = _validate_while_probing(gw)
        _assert_failed_at_the_last_line(batch)
        _assert_prompt(validating, answered)
        # A good file goes the whole way: planned into S3 by the validation process, run, merged.
        good = gw.client("sk-small")
        rows = [{"custom_id": f"g{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(5)]
        source = good.files.create(file=("good.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()),
                                   purpose="batch")
        created = good.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = until(gw, "sk-small", created.id, finished, timeout=90)
        assert done.status == "completed" and done.output_file_id is not None
        out = [json.loads(x) for x in good.files.content(done.output_file_id).text.splitlines()]
        assert [o["custom_id"] for o in out] == [f"g{i}" for i in range(5)]


def _validation_processes(gw: Gateway) -> list[psutil.Process]:
    """The API process's pool of validation processes (the spawned interpreters, not its workers)."""
    return [p for p in psutil.Process(gw.process.pid).children()
            if any("spawn_main" in part for part in p.cmdline())]


def test_a_validation_process_that_dies_leaves_the_batch_to_the_sweep(upstream: Upstream, tmp_path: Path) -> None:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=LINES, max_file_bytes=64 << 20)
    with start_gateway(config, tmp_path / "data") as gw:
        big = gw.client("sk-big")
        source = big.files.create(file=("big.jsonl", _big_file()), purpose="batch")
        # started with the runtime, ahead of any batch
        first = eventually(lambda: _validation_processes(gw), 60, "the validation processes", interval=0.1,
                           detail=lambda: gw.log()[-3000:])
        batch = big.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        for process in first:
            process.send_signal(signal.SIGKILL)
        assert big.batches.retrieve(batch.id).status == "validating"
        # The API goes on answering; the sweep takes the batch up again once its validation is stale.
        assert gw.client("sk-small").batches.list().data == []
        failed = until(gw, "sk-big", batch.id, finished, timeout=120)
        _assert_failed_at_the_last_line(failed)
        assert gw.alive()
        again = _validation_processes(gw)
        assert again and not {p.pid for p in again} & {p.pid for p in first}


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _idle(processes: list[psutil.Process]) -> dict[int, float] | None:
    """Each process's CPU seconds, once none of them used any for half a second (their interpreters have
    started: the CPU used from then on is the read's); None before."""
    before = {p.pid: _cpu(p) for p in processes}
    time.sleep(0.5)
    after = {p.pid: _cpu(p) for p in processes}
    return after if all(after[pid] - before[pid] < 0.02 for pid in after) else None


def test_a_validation_process_that_dies_mid_read_of_a_message_batch_create_is_replaced(
    upstream: Upstream, tmp_path: Path,
) -> None:
    """The create's body is read in a validation process, not in the API's: killed mid-read, the read starts
    again in a fresh process (the body is still on disk), the create answers as if nothing happened, and the
    next one works."""
    pad = b"[" + b",".join([b"{}"] * 600) + b"]"
    requests = 20_000  # about 36 MB of objects: a read of a second or more, long enough to be cut short
    body = b'{"requests":[' + b",".join(
        b'{"custom_id":"r%d","params":{"model":"%s","max_tokens":8,"messages":[],"pad":%s}}' % (i, MODEL.encode(), pad)
        for i in range(requests)) + b"]}"
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=50_000)
    with start_gateway(config, tmp_path / "data") as gw:
        first = eventually(lambda: _validation_processes(gw), 60, "the validation processes", interval=0.1,
                           detail=lambda: gw.log()[-3000:])
        before = eventually(lambda: _idle(first), 60, "the validation processes started and idle", interval=0.1)
        replies: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: replies.append(httpx.post(
            gw.url + "/v1/messages/batches", content=body, timeout=300,
            headers={"x-api-key": "sk-big", "content-type": "application/json"})))
        sender.start()
        reading = eventually(lambda: next((p for p in first if _cpu(p) - before[p.pid] > 0.3), None), 120,
                             "a validation process reading the body", interval=0.02)
        reading.send_signal(signal.SIGKILL)
        sender.join(300)

        [reply] = replies
        assert reply.status_code == 200, reply.text
        created = reply.json()
        assert created["processing_status"] == "in_progress"
        assert created["request_counts"]["processing"] == requests
        assert "a validation process died while reading a Message Batch create; reading it again" in gw.log()
        again = _validation_processes(gw)
        assert again and reading.pid not in {p.pid for p in again}
        small = httpx.post(gw.url + "/v1/messages/batches", timeout=60,
                           headers={"x-api-key": "sk-small", "content-type": "application/json"},
                           json={"requests": [{"custom_id": "a", "params": {"model": MODEL, "max_tokens": 8,
                                                                            "messages": []}}]})
        assert small.status_code == 200, small.text
        assert small.json()["request_counts"]["processing"] == 1
        assert gw.alive()
        for batch_id, key in ((created["id"], "sk-big"), (small.json()["id"], "sk-small")):
            httpx.post(f"{gw.url}/v1/messages/batches/{batch_id}/cancel", headers={"x-api-key": key}, timeout=30)
