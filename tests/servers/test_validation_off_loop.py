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
    """`batchyard serve --redis-url … --blobs s3://…` (an API replica with its worker) over moto's S3."""
    return start_shared(config, data_dir, redis_url, blobs=s3.location(data_dir.parent.name), env=s3.env())


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
    found = []
    for process in psutil.Process(gw.process.pid).children():
        try:
            if any("spawn_main" in part for part in process.cmdline()):
                found.append(process)
        except psutil.Error:  # one just killed, not yet reaped (a zombie), or gone
            continue
    return found


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


def test_a_callers_estimate_is_not_kept_behind_the_plans_queued_before_it(upstream: Upstream, tmp_path: Path) -> None:
    """Eight big batches are planned by the two validation processes, two at a time. Another team's cost estimate
    (a caller waiting, as a reserving create's estimate does) takes the first process freed, ahead of the six
    plans that queued before it: when it is answered, most batches are still validating. Handed to the pool in
    arrival order, it waited until at least six of the eight plans were done."""
    lines = 40_000
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=LINES, max_file_bytes=64 << 20)
    with start_gateway(config, tmp_path / "data") as gw:
        big, small = gw.client("sk-big"), gw.client("sk-small")
        source = big.files.create(file=("big.jsonl", _big_file(lines)), purpose="batch")
        row = {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}}
        tiny = small.files.create(file=("tiny.jsonl", (json.dumps(row) + "\n").encode()), purpose="batch")
        for _ in range(2):  # each process loads its tokenizer (LiteLLM's) at its first estimate, not timed here
            small.get(f"/files/{tiny.id}/cost_estimate", cast_to=object)
        batches = [big.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                      completion_window="24h") for _ in range(8)]
        estimate = small.get(f"/files/{tiny.id}/cost_estimate", cast_to=object)
        statuses = [big.batches.retrieve(b.id).status for b in batches]
        assert isinstance(estimate, dict) and estimate["lines"] == 1, estimate
        assert statuses.count("validating") >= 4, statuses
        for batch in batches:
            _assert_failed_at_the_last_line(until(gw, "sk-big", batch.id, finished, timeout=120), lines)


def _reading(gw: Gateway) -> psutil.Process | None:
    """The validation process reading a Message Batch create's spooled body (it has the file open), if any."""
    for process in _validation_processes(gw):
        try:
            paths = [f.path for f in process.open_files()]
        except psutil.Error:
            continue
        if any(path.endswith("/body.json") and "batchyard-message-batch-" in path for path in paths):
            return process
    return None


def _pathological_body(requests: int) -> bytes:
    """`requests` requests of 600 `{}` each (about 1.8 KB): a read of a second or more for 20,000."""
    pad = b"[" + b",".join([b"{}"] * 600) + b"]"
    return b'{"requests":[' + b",".join(
        b'{"custom_id":"r%d","params":{"model":"%s","max_tokens":8,"messages":[],"pad":%s}}' % (i, MODEL.encode(), pad)
        for i in range(requests)) + b"]}"


def _create_killing_readers(gw: Gateway, body: bytes, kills: int) -> tuple[httpx.Response, list[int]]:
    """The create's reply, each of the first `kills` processes seen reading its body killed mid-read."""
    replies: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: replies.append(httpx.post(
        gw.url + "/v1/messages/batches", content=body, timeout=300,
        headers={"x-api-key": "sk-big", "content-type": "application/json"})))
    sender.start()
    killed: list[int] = []
    for _ in range(kills):
        reader = eventually(lambda: (p := _reading(gw)) is not None and p.pid not in killed and p, 120,
                            "a validation process reading the body", interval=0.01, detail=lambda: gw.log()[-3000:])
        reader.send_signal(signal.SIGKILL)
        killed.append(reader.pid)
    sender.join(300)
    [reply] = replies
    return reply, killed


def _small_create(gw: Gateway) -> httpx.Response:
    return httpx.post(gw.url + "/v1/messages/batches", timeout=60,
                      headers={"x-api-key": "sk-small", "content-type": "application/json"},
                      json={"requests": [{"custom_id": "a", "params": {"model": MODEL, "max_tokens": 8,
                                                                       "messages": []}}]})


def test_a_validation_process_that_dies_mid_read_of_a_message_batch_create_is_replaced(
    upstream: Upstream, tmp_path: Path,
) -> None:
    """The create's body is read in a validation process, not in the API's: killed mid-read, the read starts
    again in a fresh process (the body is still on disk) and the create answers as if nothing happened;
    killed twice, the create is a 529 `overloaded_error` (the machine's fault, which the anthropic SDK
    retries), never a 500 or a batch. Either way the next create works."""
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=50_000)
    body = _pathological_body(20_000)
    with start_gateway(config, tmp_path / "data") as gw:
        reply, killed = _create_killing_readers(gw, body, kills=1)
        assert reply.status_code == 200, reply.text
        created = reply.json()
        assert created["processing_status"] == "in_progress"
        assert created["request_counts"]["processing"] == 20_000
        assert "a validation process died while reading a Message Batch create; reading it again" in gw.log()
        assert not set(killed) & {p.pid for p in _validation_processes(gw)}

        reply, killed = _create_killing_readers(gw, body, kills=2)
        assert reply.status_code == 529, reply.text
        error = reply.json()
        assert error["type"] == "error" and error["error"]["type"] == "overloaded_error", error
        assert "Try again later" in error["error"]["message"] and reply.headers["retry-after"].isdigit()
        assert len(set(killed)) == 2

        small = _small_create(gw)
        assert small.status_code == 200, small.text
        assert small.json()["request_counts"]["processing"] == 1
        assert gw.alive()
        assert [b["id"] for b in httpx.get(gw.url + "/v1/messages/batches", headers={"x-api-key": "sk-big"},
                                           timeout=30).json()["data"]] == [created["id"]]  # none of the 529's
        for batch_id, key in ((created["id"], "sk-big"), (small.json()["id"], "sk-small")):
            httpx.post(f"{gw.url}/v1/messages/batches/{batch_id}/cancel", headers={"x-api-key": key}, timeout=30)
