"""Benchmark: a batch beside live traffic on one vLLM server (the loopback stand-in, tests/fakes/stubs_vllm.py).

    .venv/bin/python bench/background.py [--capacity 32] [--service-ms 160] [--live-share 0.5] [--seconds 40]
                                         [--lines 4000] [--today-concurrency 128] [--policy priority]

The server runs `--capacity` requests at once, `--service-ms` each, the rest waiting by (priority, arrival).
Live traffic is an open-loop Poisson stream at `--live-share` of its capacity for `--seconds` (priority 0, sent
straight to the server). Three runs: live alone; live beside a `--lines` batch as batchyard sends it today
(a realtime route at `--today-concurrency`, batch_settings.max_concurrency's default); live beside the same
batch on a `batch_mode: background` route. The batch runs in a process of its own (LiteLLM's Router and the
pass-through, as a worker runs them), starting with the live stream. Printed per run: live p50/p99, the batch's
throughput while live traffic ran as a share of the spare capacity, the server's mean waiting queue, and
whether every line answered 200. Aims (background): live p99 <= 1.3x alone, batch >= 60% of the spare
capacity, waiting queue <= half the slots on average, every line 200.

`--server URL --model NAME` runs the same against a real server instead (`bench/background_vllm.sh` starts
`vllm serve` on the CPU engine with `--scheduling-policy priority`): give its `--capacity` (max_num_seqs) and
a `--service-ms` measured alone; its waiting queue is then sampled from its /metrics every 100 ms.

Not a test: the figures need a quiet machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = "shared-model"


class External:
    """A real server in the stand-in's place: its /metrics sampled for the waiting queue's mean."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.samples: list[tuple[float, float]] = []

    def reset(self) -> None:
        self.samples = []

    async def sample(self, seconds: float) -> None:
        import aiohttp

        from gateway.scheduling.busy_server import read_load

        async with aiohttp.ClientSession() as session:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                async with session.get(self.url + "/metrics") as reply:
                    load = read_load(await reply.text(), MODEL)
                if load is not None:
                    self.samples.append((load.waiting, load.running))
                await asyncio.sleep(0.1)

    def stats(self) -> dict[str, Any]:
        n = max(len(self.samples), 1)
        return {"mean_waiting": sum(w for w, _ in self.samples) / n,
                "mean_running": sum(r for _, r in self.samples) / n}


def _batch(url: str, model: str, mode: str, lines: int, concurrency: int, ready: Any, go: Any, out: Any) -> None:
    """The child: one route's backend (LiteLLM's Router, the pass-through) running the batch."""
    from gateway.config.schema import parse_config
    from gateway.domain import BatchRequest, Endpoint
    from providers.litellm_backend import LiteLLMBackend

    # today's route: the pass-through at batch_settings.max_concurrency (the backend's bound); background: paced
    # within its max_parallel_requests
    entry: dict[str, Any] = {"model_name": "batch", "litellm_params": {"model": f"hosted_vllm/{model}",
                                                                       "api_base": url + "/v1", "api_key": "none"}}
    if mode == "background":
        entry.update(max_parallel_requests=concurrency, model_info={"batch_mode": "background"})
    config = parse_config({"model_list": [entry]})
    requests = [BatchRequest(line=i + 1, custom_id=f"r{i}", url=Endpoint.CHAT,
                             body={"model": "batch", "max_tokens": 16,
                                   "messages": [{"role": "user", "content": f"line {i}"}]})
                for i in range(lines)]

    async def run() -> tuple[list[float], list[int]]:
        backend = LiteLLMBackend([config.routes["batch"]], {"num_retries": 3}, concurrency, resolve=config.route)
        await backend.start()
        ready.set()
        go.wait()
        done, statuses = [], []
        async for result in backend.execute(requests):
            done.append(time.time())
            statuses.append(result.status_code or 0)
        await backend.aclose()
        return done, statuses

    out.put(asyncio.run(run()))


async def _live(url: str, rate: float, seconds: float, seed: int) -> list[float]:
    """Open-loop Poisson arrivals at `rate` a second for `seconds`: each request's latency in seconds."""
    import aiohttp

    rng = random.Random(seed)
    latencies: list[float] = []
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "live"}]}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            began = time.monotonic()
            async with session.post(url + "/v1/chat/completions", json=body) as reply:
                await reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"live request answered {reply.status}")
            latencies.append(time.monotonic() - began)

        tasks = []
        start = time.monotonic()
        at = 0.0
        while at < seconds:
            at += rng.expovariate(rate)
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_case(stub: Any, mode: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """Live traffic for `--seconds`, beside a batch of `mode` (None: alone)."""
    rate = args.live_share * args.capacity / (args.service_ms / 1000)
    child = None
    if mode is not None:
        ctx = mp.get_context("spawn")
        ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
        concurrency = args.today_concurrency if mode == "today" else args.capacity * 2
        child = ctx.Process(target=_batch, args=(stub.url, MODEL, mode, args.lines, concurrency, ready, go, out))
        child.start()
        if not ready.wait(120):
            raise RuntimeError("the batch process did not start")
    stub.reset()
    began = time.time()
    if child is not None:
        go.set()
    if isinstance(stub, External):
        async def both() -> list[float]:
            latencies, _ = await asyncio.gather(_live(stub.url, rate, args.seconds, seed=7), stub.sample(args.seconds))
            return latencies
        latencies = asyncio.run(both())
    else:
        latencies = asyncio.run(_live(stub.url, rate, args.seconds, seed=7))
    ended = time.time()
    server = stub.stats()
    row: dict[str, Any] = {"mode": mode or "alone", "p50_ms": 1000 * _pct(latencies, 0.5),
                           "p99_ms": 1000 * _pct(latencies, 0.99), "live": len(latencies),
                           "mean_waiting": server["mean_waiting"], "mean_running": server["mean_running"],
                           "server_wait_p99_ms": server.get("live_wait_p99_ms")}
    if child is not None:
        done, statuses = out.get(timeout=600)
        child.join(30)
        spare = (args.capacity - rate * args.service_ms / 1000) / (args.service_ms / 1000)  # lines a second
        within = sum(1 for t in done if began <= t <= ended)
        row.update({"batch_share": within / (spare * (ended - began)), "lines": len(statuses),
                    "all_200": all(s == 200 for s in statuses), "batch_wall_s": max(done) - began})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--capacity", type=int, default=32)
    parser.add_argument("--service-ms", type=float, default=160.0)
    parser.add_argument("--live-share", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--today-concurrency", type=int, default=128)
    parser.add_argument("--policy", choices=("priority", "fcfs"), default="priority",
                        help="the server's --scheduling-policy (fcfs: it refuses priority, the route goes without)")
    parser.add_argument("--cases", default="alone,today,background")
    parser.add_argument("--server", default=None, help="a real server's base URL (no /v1) instead of the stand-in")
    parser.add_argument("--model", default=MODEL, help="the model the server serves (with --server)")
    args = parser.parse_args()
    globals()["MODEL"] = args.model  # run_case sends it to the batch process
    from tests.fakes.stub_process import start_stub

    print(f"load average at start: {os.getloadavg()}")
    stub_args = ["--capacity", str(args.capacity), "--service-ms", str(args.service_ms), "--model", MODEL,
                 "--scheduling-policy", args.policy]
    rows = []
    with contextlib.nullcontext(External(args.server)) if args.server else start_stub(
            "tests.fakes.stubs_vllm", stub_args) as stub:
        for case in args.cases.split(","):
            rows.append(run_case(stub, None if case == "alone" else case, args))
            print(rows[-1], flush=True)
    alone = next((r for r in rows if r["mode"] == "alone"), None)
    where = f"server {args.server}" if args.server else "the stand-in"
    print(f"\n{where}: capacity {args.capacity}, {args.service_ms:.0f} ms a request, "
          f"live Poisson at {args.live_share:.0%} "
          f"for {args.seconds:.0f} s, a {args.lines}-line batch, server --scheduling-policy {args.policy}")
    print(f"{'run':<12}{'live p50':>10}{'live p99':>10}{'p99/alone':>11}{'batch/spare':>13}{'waiting':>9}"
          f"{'batch wall':>12}{'all 200':>9}{'live wait at server p99':>25}")
    for r in rows:
        ratio = f"{r['p99_ms'] / alone['p99_ms']:.2f}x" if alone else "-"
        share = f"{r['batch_share']:.0%}" if "batch_share" in r else "-"
        wall = f"{r['batch_wall_s']:.1f} s" if "batch_wall_s" in r else "-"
        at_server = "-" if r["server_wait_p99_ms"] is None else f"{r['server_wait_p99_ms']:.0f} ms"
        print(f"{r['mode']:<12}{r['p50_ms']:>8.0f}ms{r['p99_ms']:>8.0f}ms{ratio:>11}{share:>13}"
              f"{r['mean_waiting']:>9.2f}{wall:>12}{r.get('all_200', '-')!s:>9}{at_server:>25}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
