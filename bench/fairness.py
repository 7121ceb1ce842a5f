"""Benchmark: one team's small batch beside another team's large one, on one gateway.

    .venv/bin/python bench/fairness.py [--big 20000] [--small 20] [--latency-ms 500] [--repeats 3]
                                       [--modes embedded,shared] [--engine-big 2000] [--workers 2]
                                       [--engine-args '{"scheduling_policy": "fcfs"}']

Two teams (A, B) share one upstream route that answers each request after
`--latency-ms` (the loopback upstream), in each mode: `batchyard serve
--workers N` (embedded) and `batchyard serve --redis-url …` beside N
`batchyard worker`s (shared, over a redis-server of its own). Per
repeat it measures B's `--small`-line batch alone, A's `--big`-line batch
alone, and then both: A first, B once A is running. It prints the medians of
`--repeats`:

- B's wall beside A / B's wall alone (aim <= 2x);
- A's throughput beside B / A's alone (aim >= 0.9x);
- the same on a local-engine route (the tiny random-weight Llama, CPU), with
  `--engine-big` lines for A (B's aim <= 3x); `--engine-big 0` skips it.

Not a test: the figures need a quiet machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.server_helpers import Gateway, gateway_config, start_gateway  # noqa: E402
from tests.support.services import RedisServer, process_env, start_worker  # noqa: E402
from tests.support.team_helpers import start_shared  # noqa: E402

TEAMS = [{"team_id": "A", "api_keys": ["sk-a"]}, {"team_id": "B", "api_keys": ["sk-b"]}]


@dataclass
class Figures:
    b_alone: list[float]
    b_beside: list[float]
    a_alone: list[float]  # requests/s
    a_beside: list[float]

    def line(self, what: str, aim_b: float) -> str:
        b = statistics.median(self.b_beside) / statistics.median(self.b_alone)
        a = statistics.median(self.a_beside) / statistics.median(self.a_alone)
        return (f"  {what:34s} B beside A / alone {b:6.2f}x (aim <= {aim_b:g}x; {statistics.median(self.b_alone):.2f} s"
                f" alone)   A throughput beside B / alone {a:5.2f}x (aim >= 0.9x; "
                f"{statistics.median(self.a_alone):.0f} req/s alone)")


def _file(model: str, n: int, tag: str, body: dict[str, Any]) -> bytes:
    rows = [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "messages": [{"role": "user", "content": f"{tag} {i}"}], **body}}
            for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _submit(gw: Gateway, key: str, data: bytes) -> tuple[str, float]:
    client = gw.client(key)
    source = client.files.create(file=("in.jsonl", data), purpose="batch")
    started = time.perf_counter()
    return client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id, started


def _wait(gw: Gateway, key: str, batch_id: str, started: float, at_least: int | None = None) -> float:
    """Seconds from `started` until the batch finished (or has `at_least` results)."""
    client = gw.client(key)
    while True:
        batch = client.batches.retrieve(batch_id)
        counts = batch.request_counts
        done = counts.completed + counts.failed if counts else 0
        if batch.status in ("completed", "failed", "expired", "cancelled") or (at_least and done >= at_least):
            assert at_least or batch.status == "completed", batch
            return time.perf_counter() - started
        time.sleep(0.05)


def measure(gw: Gateway, model: str, big: int, small: int, repeats: int, body: dict[str, Any]) -> Figures:
    fig = Figures([], [], [], [])
    for key in ("sk-a", "sk-b"):  # warm up: worker processes import LiteLLM (or load the engine) on first use
        warm, t = _submit(gw, key, _file(model, 2, f"warm-{key}", body))
        _wait(gw, key, warm, t)
    for r in range(repeats):
        bid, t = _submit(gw, "sk-b", _file(model, small, f"b-alone-{r}", body))
        fig.b_alone.append(_wait(gw, "sk-b", bid, t))
        aid, t = _submit(gw, "sk-a", _file(model, big, f"a-alone-{r}", body))
        fig.a_alone.append(big / _wait(gw, "sk-a", aid, t))
        aid, ta = _submit(gw, "sk-a", _file(model, big, f"a-beside-{r}", body))
        _wait(gw, "sk-a", aid, ta, at_least=max(1, big // 20))  # A is running, its shards fill the workers
        bid, tb = _submit(gw, "sk-b", _file(model, small, f"b-beside-{r}", body))
        fig.b_beside.append(_wait(gw, "sk-b", bid, tb))
        fig.a_beside.append(big / _wait(gw, "sk-a", aid, ta))
    return fig


@contextlib.contextmanager
def gateway(mode: str, config: dict[str, Any], tmp: Path, workers: int) -> Iterator[Gateway]:
    data = tmp / f"{mode}-{time.monotonic_ns()}" / "data"
    if mode == "embedded":
        with start_gateway(config, data, workers=workers) as gw:
            yield gw
        return
    with contextlib.ExitStack() as stack:
        redis = RedisServer().start()
        stack.callback(redis.close)
        # As the chart deploys it: an API replica that runs no shards, and `workers` worker processes (as
        # embedded mode's `serve --workers N` runs N worker processes beside its API).
        gw = stack.enter_context(start_shared(config, data, redis.url, with_worker=False))
        config_path = data.parent / "shared.config.yaml"
        for _ in range(workers):
            worker = start_worker(config_path, redis.url, str(data / "blobs")).wait_ready(120)
            stack.callback(worker.close)
        yield gw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=int, default=20_000,
                        help="team A's batch, upstream route (default 20000; 0: skip the upstream route)")
    parser.add_argument("--small", type=int, default=20, help="team B's batch (default 20)")
    parser.add_argument("--latency-ms", type=float, default=500, help="the upstream's answer time (default 500)")
    parser.add_argument("--repeats", type=int, default=3, help="medians of this many runs (default 3)")
    parser.add_argument("--modes", default="embedded,shared", help="embedded, shared or both (default both)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per gateway (default 2)")
    parser.add_argument("--engine-big", type=int, default=2_000,
                        help="team A's batch on the local-engine route (default 2000; 0: skip the engine)")
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help="more engine_args for the local-engine route, as JSON, e.g. "
                             "'{\"scheduling_policy\": \"fcfs\"}' (default none)")
    args = parser.parse_args()
    env = process_env({})
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    rows: list[str] = []
    with start_upstream(latency_ms=args.latency_ms) as upstream, tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, max_lines=max(args.big, 50_000))
        for mode in args.modes.split(",") if args.big else []:
            with gateway(mode, config, Path(tmp), args.workers) as gw:
                fig = measure(gw, "gpt-mini", args.big, args.small, args.repeats, {})
                rows.append(fig.line(f"{mode}, upstream ({args.latency_ms:g} ms)", 2))
            print(rows[-1], flush=True)
        if args.engine_big:
            from local_engine import build_tiny_models

            models = os.environ.get("BATCHYARD_TINY_MODELS") or str(REPO / ".batchyard" / "models")
            model = str(build_tiny_models(Path(models)).llama)
            engine = {"model_name": "tiny", "litellm_params": {"model": f"vllm/{model}"},
                      "engine_args": {"dtype": "float32", "max_model_len": 256, "enforce_eager": True,
                                      "max_num_seqs": 16, **args.engine_args}}
            local = {**config, "model_list": [engine]}
            for mode in args.modes.split(","):
                with gateway(mode, local, Path(tmp), 1) as gw:
                    fig = measure(gw, "tiny", args.engine_big, args.small, args.repeats,
                                  {"max_tokens": 16, "ignore_eos": True})
                    rows.append(fig.line(f"{mode}, local engine (tiny Llama)", 3))
                print(rows[-1], flush=True)
    print(f"\nfairness: team B's {args.small}-line batch beside team A's batch, medians of {args.repeats}")
    print("\n".join(rows))
    print(f"  load average {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
