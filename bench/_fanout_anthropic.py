"""`bench/upstream_fanout.py --anthropic`: the same requests as an OpenAI batch and as an Anthropic Message Batch.

One `serve` (embedded, the product's default workers) in front of the loopback upstream. Each round sends N
chat requests twice, alternating: as an OpenAI batch (the `openai` SDK: upload, create, poll, download the
output file) and as an Anthropic Message Batch (the `anthropic` SDK: `messages.batches.create(requests=…)`,
poll, iterate `results()`). Both are timed alike, from the requests in memory to the results read into
Python objects: the OpenAI side writes its JSONL and reads each output line (`json.loads`) inside the
timer, as the anthropic SDK serializes the requests and parses each result inside it. Each batch's time is
also printed in phases (create, run, results), so the client's share is in view. Both run on the same
route (`openai/…` at the loopback upstream): the Anthropic lines go through LiteLLM's Anthropic-messages
adapter's translation (`providers.messages_bridge`), the OpenAI ones as they are. The aim: the Anthropic
batch at >= 0.9x the OpenAI batch's throughput.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.schema import parse_config
from gateway.runtime.supervisor import default_workers
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

KEY = "sk-bench-team"
_QUIET = 3.0  # seconds before each timed batch
MODEL = "bench-model"


def _params(i: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": f"request number {i}"}]}


@dataclass
class Round:
    """One batch's wall time from the requests in memory to the results in memory, in three phases."""

    create: float  # the requests serialized and sent, until the batch's id came back
    run: float  # polling, until the batch had ended
    results: float  # the results downloaded and read into Python objects
    client_cpu: float  # CPU seconds of this process (the client: its SDK's work) over the round

    @property
    def wall(self) -> float:
        return self.create + self.run + self.results


def _openai_round(gw: Gateway, n: int) -> Round:
    """The openai SDK: the requests written as JSONL and uploaded, the batch created and polled, its output
    file downloaded and each line read (`json.loads`: the openai SDK has no typed reader for them), one at a
    time, as the anthropic SDK's `results()` gives them."""
    client = gw.client(KEY).with_options(timeout=600)
    requests = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": _params(i)}
                for i in range(n)]
    c0, t0 = time.process_time(), time.perf_counter()
    body = b"".join(json.dumps(r).encode() + b"\n" for r in requests)
    source = client.files.create(file=("in.jsonl", io.BytesIO(body)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    t1 = time.perf_counter()
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id is not None, batch
    t2 = time.perf_counter()
    text = client.files.content(batch.output_file_id).text
    got = sum(1 for line in text.splitlines() if line and json.loads(line)["response"]["status_code"] == 200)
    t3, c3 = time.perf_counter(), time.process_time()
    assert got == n, f"{got} of {n} OpenAI results"
    return Round(t1 - t0, t2 - t1, t3 - t2, c3 - c0)


def _anthropic_round(gw: Gateway, n: int) -> Round:
    """The anthropic SDK: `messages.batches.create(requests=…)`, polled, its `results()` iterated (each line
    read into the SDK's `MessageBatchIndividualResponse`)."""
    import anthropic

    client = anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0, timeout=600)
    requests: list[Any] = [{"custom_id": f"req-{i}", "params": _params(i)} for i in range(n)]
    c0, t0 = time.process_time(), time.perf_counter()
    batch = client.messages.batches.create(requests=requests)
    t1 = time.perf_counter()
    while batch.processing_status != "ended":
        time.sleep(0.2)
        batch = client.messages.batches.retrieve(batch.id)
    t2 = time.perf_counter()
    succeeded, failed = 0, []
    for r in client.messages.batches.results(batch.id):
        if r.result.type == "succeeded":
            succeeded += 1
        elif len(failed) < 3:
            failed.append(r)
    t3, c3 = time.perf_counter(), time.process_time()
    assert succeeded == n, f"{succeeded} of {n} Anthropic results succeeded: {batch.request_counts}, e.g. {failed}"
    return Round(t1 - t0, t2 - t1, t3 - t2, c3 - c0)


def _phases(rounds: list[Round]) -> str:
    create, run, results = (statistics.median(getattr(r, k) for r in rounds) for k in ("create", "run", "results"))
    client = statistics.median(r.client_cpu for r in rounds)
    return f"create {create:5.2f} s, run {run:5.2f} s, results {results:5.2f} s; client CPU {client:4.2f} s"


def anthropic_mode(upstream: Upstream, n: int, repeat: int) -> None:
    config = gateway_config(upstream, models=(MODEL,), teams=[{"team_id": "bench", "api_keys": [KEY]}],
                            max_lines=max(n, 50_000))
    workers = default_workers(parse_config(config), serving=True)
    with tempfile.TemporaryDirectory() as tmp, start_gateway(config, Path(tmp) / "data", workers=workers) as gw:
        _openai_round(gw, 500)  # warm-up: the workers' first LiteLLM calls on both paths
        _anthropic_round(gw, 500)
        ours: list[Round] = []
        theirs: list[Round] = []
        for i in range(repeat):
            # Each batch starts on a quiet gateway: the finalizer's clean-up of the batch before (its result
            # log and shard files dropped after the status reads ended) would otherwise run into the next
            # round, and only into the Anthropic one, which starts the moment the OpenAI client's quick read
            # of its output ends (the anthropic SDK's slower read covers it the other way round).
            time.sleep(_QUIET)
            ours.append(_openai_round(gw, n))
            time.sleep(_QUIET)
            theirs.append(_anthropic_round(gw, n))
            print(f"  round {i + 1}: OpenAI batch {n / ours[-1].wall:6.0f} req/s | Anthropic Message Batch "
                  f"{n / theirs[-1].wall:6.0f} req/s", flush=True)
    o, a = (statistics.median(n / r.wall for r in rounds) for rounds in (ours, theirs))
    # The gateway's share: each round's wall time less the client's own CPU (its SDK serializing the requests,
    # polling, parsing the results), which runs before, between and after the gateway's work, not beside it.
    so, sa = (statistics.median(n / (r.wall - r.client_cpu) for r in rounds) for rounds in (ours, theirs))
    print(f"\n{n} requests through `serve` ({workers} worker process(es), {os.cpu_count()} cores), median of "
          f"{repeat}, from the requests in memory to the results read")
    print(f"  OpenAI batch (openai SDK, /v1/chat/completions)        {o:8.0f} req/s   {_phases(ours)}")
    print(f"  Anthropic Message Batch (anthropic SDK, /v1/messages)  {a:8.0f} req/s   {_phases(theirs)}")
    print(f"  ratio Anthropic/OpenAI {a / o:.2f}   (aim >= 0.9)")
    print(f"  the gateway's share (each round less its client's CPU): OpenAI {so:.0f} req/s, Anthropic {sa:.0f} req/s,"
          f" ratio {sa / so:.2f}")
