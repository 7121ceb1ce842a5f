"""`bench/upstream_fanout.py --anthropic`: the same requests as an OpenAI batch and as an Anthropic Message Batch.

One `serve` (embedded, the product's default workers) in front of the loopback upstream. Each round sends N
chat requests twice, alternating: as an OpenAI batch (the `openai` SDK: upload, create, poll, download the
output file) and as an Anthropic Message Batch (the `anthropic` SDK: `messages.batches.create(requests=…)`,
poll, iterate `results()`), each timed from the first byte sent to the last result read. Both run on the same
route (`openai/…` at the loopback upstream): the Anthropic lines go through LiteLLM's Anthropic-messages
adapter, the OpenAI ones as they are. The aim: the Anthropic batch at >= 0.9x the OpenAI batch's throughput.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.config.schema import parse_config
from gateway.runtime.supervisor import default_workers
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

KEY = "sk-bench-team"
MODEL = "bench-model"


def _params(i: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": f"request number {i}"}]}


def _openai_round(gw: Gateway, n: int) -> float:
    client = gw.client(KEY).with_options(timeout=600)
    body = b"".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": _params(i)}).encode() + b"\n" for i in range(n))
    started = time.perf_counter()
    source = client.files.create(file=("in.jsonl", io.BytesIO(body)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id is not None, batch
    got = sum(1 for line in client.files.content(batch.output_file_id).text.splitlines() if line)
    wall = time.perf_counter() - started
    assert got == n, f"{got} of {n} OpenAI results"
    return n / wall


def _anthropic_round(gw: Gateway, n: int) -> float:
    import anthropic

    client = anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0, timeout=600)
    requests: list[Any] = [{"custom_id": f"req-{i}", "params": _params(i)} for i in range(n)]
    started = time.perf_counter()
    batch = client.messages.batches.create(requests=requests)
    while batch.processing_status != "ended":
        time.sleep(0.2)
        batch = client.messages.batches.retrieve(batch.id)
    succeeded = sum(1 for r in client.messages.batches.results(batch.id) if r.result.type == "succeeded")
    wall = time.perf_counter() - started
    assert succeeded == n, f"{succeeded} of {n} Anthropic results succeeded: {batch.request_counts}"
    return n / wall


def anthropic_mode(upstream: Upstream, n: int, repeat: int) -> None:
    config = gateway_config(upstream, models=(MODEL,), teams=[{"team_id": "bench", "api_keys": [KEY]}],
                            max_lines=max(n, 50_000))
    workers = default_workers(parse_config(config), serving=True)
    with tempfile.TemporaryDirectory() as tmp, start_gateway(config, Path(tmp) / "data", workers=workers) as gw:
        _openai_round(gw, 500)  # warm-up: the workers' first LiteLLM calls on both paths
        _anthropic_round(gw, 500)
        ours: list[float] = []
        theirs: list[float] = []
        for i in range(repeat):
            ours.append(_openai_round(gw, n))
            theirs.append(_anthropic_round(gw, n))
            print(f"  round {i + 1}: OpenAI batch {ours[-1]:6.0f} req/s | Anthropic Message Batch "
                  f"{theirs[-1]:6.0f} req/s", flush=True)
    o, a = statistics.median(ours), statistics.median(theirs)
    print(f"\n{n} requests through `serve` ({workers} worker process(es), {os.cpu_count()} cores), median of "
          f"{repeat}, create to last result read")
    print(f"  OpenAI batch (openai SDK, /v1/chat/completions)        {o:8.0f} req/s")
    print(f"  Anthropic Message Batch (anthropic SDK, /v1/messages)  {a:8.0f} req/s")
    print(f"  ratio Anthropic/OpenAI {a / o:.2f}   (aim >= 0.9)")
