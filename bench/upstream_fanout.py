"""Benchmark: `batchyard run` against a plain `openai.AsyncOpenAI` loop, same upstream, same concurrency.

    .venv/bin/python bench/upstream_fanout.py [--requests 20000] [--small 1000] [--concurrency 64] [--repeat 3]
    .venv/bin/python bench/upstream_fanout.py --anthropic [--requests 20000] [--repeat 3]
    .venv/bin/python bench/upstream_fanout.py --wildcard-half [--requests 20000] [--repeat 3]
    .venv/bin/python bench/upstream_fanout.py --tracing [--requests 20000] [--repeat 3]
    .venv/bin/python bench/upstream_fanout.py --schema [--requests 20000] [--repeat 3]

Both peers run as whole processes (imports included) against one loopback
upstream (tests/fakes/upstream/server.py), alternating, and the medians are compared. Also
prints batchyard's peak RSS at 1k lines and at N lines (flat memory means the
ratio stays near 1), and CPU seconds per 1,000 requests (user + sys of each
peer's whole process tree, worker processes included): unlike throughput, that
figure does not depend on the core count, and it is what a bigger machine
multiplies, so it is also printed as req/s per core. `--anthropic` instead sends
the requests through `serve` as an OpenAI batch and as an Anthropic Message
Batch (`bench/_fanout_anthropic.py`). `--wildcard-half` times config load (200 entries, 20 wildcard
routes) and compares a file of exact model_names with one whose half goes through a wildcard route
(`bench/_fanout_wildcard.py`). `--tracing` compares the same run with traces off, on with every request
sampled (exported over OTLP/HTTP to a loopback receiver) and on at a 1% request sample, with the spans per
second exported (`bench/_fanout_tracing.py`). `--schema` compares lines with a 20-field json_schema, every reply
valid, with the output check on and off, and prints the validator's time per line (`bench/_fanout_schema.py`).
The added CPU per request
is the marginal figure (the big file's CPU less the small file's, per line
between them), the one gateways publish. Then the same file with worker
processes (the product's default rule, or --workers). The load average is
printed at both ends. Not a test: numbers on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._fanout_anthropic import anthropic_mode  # noqa: E402
from bench._fanout_schema import schema_mode  # noqa: E402
from bench._fanout_tracing import tracing_mode  # noqa: E402
from bench._fanout_wildcard import wildcard_mode  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402

_PEER = """
import asyncio, json, sys
import openai

async def main(src, dst, base_url, concurrency):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=3)
    limit = asyncio.Semaphore(concurrency)
    lines = [json.loads(x) for x in open(src)]

    async def one(item):
        async with limit:
            body = dict(item["body"])
            reply = await client.chat.completions.create(**body)
            return {"custom_id": item["custom_id"], "response": {"status_code": 200, "body": reply.model_dump()}}

    results = await asyncio.gather(*(one(x) for x in lines))
    with open(dst, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\\n")

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


def _write_input(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            body = {"model": "bench-model", "messages": [{"role": "user", "content": f"request number {i}"}]}
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _measure(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + sys) of a command and all its descendants.

    RSS is sampled every 20 ms. CPU comes from RUSAGE_CHILDREN: the kernel adds a
    child's (and its reaped descendants') times when it is waited for, so this
    counts worker processes too. Nothing else is run from here meanwhile.
    """
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return wall, peak, cpu


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=1_000, help="the small file (RSS ratio, fixed CPU)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None,
                        help="batchyard run --workers for the workers-on runs (default: the product's own rule)")
    parser.add_argument("--anthropic", action="store_true",
                        help="compare an Anthropic Message Batch with an OpenAI batch of the same requests, both "
                             "through `serve` (default: off)")
    parser.add_argument("--wildcard-half", action="store_true",
                        help="config load time with 20 wildcard routes, and a file whose half goes through one "
                             "against the same file by exact names (default: off)")
    parser.add_argument("--tracing", action="store_true",
                        help="the same run with traces off, on with every request sampled (to a loopback OTLP "
                             "receiver), and on at a 1%% request sample (default: off)")
    parser.add_argument("--schema", action="store_true",
                        help="lines with a 20-field json_schema, every reply valid: the output check on against off, "
                             "and the validator's time per line (default: off)")
    args = parser.parse_args()
    n, small_n = args.requests, args.small
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.schema:
        with start_upstream() as upstream:
            schema_mode(upstream, n, args.repeat, args.concurrency, _measure)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    if args.tracing:
        with start_upstream() as upstream:
            tracing_mode(upstream, n, args.repeat, args.concurrency, _measure)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    if args.wildcard_half:
        with start_upstream() as upstream:
            wildcard_mode(upstream, n, args.repeat, args.concurrency, _measure)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    if args.anthropic:
        with start_upstream() as upstream:
            anthropic_mode(upstream, n, args.repeat)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return

    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "bench.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: bench-model\n"
            f"    litellm_params: {{model: openai/bench-model, api_key: sk-bench, api_base: '{upstream.v1_url}'}}\n"
            f"batch_settings: {{max_concurrency: {args.concurrency}}}\n"
        )
        small, big = tmp / "small.jsonl", tmp / "big.jsonl"
        _write_input(small, small_n)
        _write_input(big, n)
        peer = tmp / "peer.py"
        peer.write_text(_PEER)

        def ours(src: Path, workers: int | None) -> list[str]:
            extra = ["--workers", str(workers)] if workers is not None else []
            return [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp / "out.jsonl"),
                    "--config", str(config), "-q", *extra]

        def theirs(src: Path) -> list[str]:
            return [sys.executable, str(peer), str(src), str(tmp / "peer.jsonl"), upstream.v1_url,
                    str(args.concurrency)]

        runs: dict[str, list[tuple[float, int, float]]] = {k: [] for k in ("ours", "peer", "ours1k", "peer1k",
                                                                            "workers")}
        for i in range(args.repeat):
            # alternating, so a noisy neighbour hurts both sides alike
            runs["ours"].append(_measure(ours(big, 0)))
            runs["peer"].append(_measure(theirs(big)))
            runs["ours1k"].append(_measure(ours(small, 0)))
            runs["peer1k"].append(_measure(theirs(small)))
            runs["workers"].append(_measure(ours(big, args.workers)))
            o, p, w = runs["ours"][-1], runs["peer"][-1], runs["workers"][-1]
            print(f"  run {i + 1}: batchyard {n / o[0]:6.0f} req/s {1000 * o[2] / n:5.2f} CPU s/1k | "
                  f"AsyncOpenAI {n / p[0]:6.0f} req/s {1000 * p[2] / n:5.2f} CPU s/1k | "
                  f"batchyard with workers {n / w[0]:6.0f} req/s {1000 * w[2] / n:5.2f} CPU s/1k", flush=True)

    def med(key: str, field: int) -> float:
        return _median([r[field] for r in runs[key]])

    mib = 1024 * 1024
    ours_rate, peer_rate = n / med("ours", 0), n / med("peer", 0)
    cpu_ours, cpu_peer = 1000 * med("ours", 2) / n, 1000 * med("peer", 2) / n
    # Per request beyond start-up: the big file's CPU less the small file's, over the lines between them.
    marg_ours = 1000 * (med("ours", 2) - med("ours1k", 2)) / (n - small_n)
    marg_peer = 1000 * (med("peer", 2) - med("peer1k", 2)) / (n - small_n)
    workers_rate, cpu_workers = n / med("workers", 0), 1000 * med("workers", 2) / n
    print(f"\nupstream fan-out: {n} chat requests, concurrency {args.concurrency}, median of {args.repeat} "
          f"(whole processes, imports included; {os.cpu_count()} cores)")
    print("  one process, no extra workers:")
    print(f"    batchyard run             {ours_rate:8.0f} req/s   {cpu_ours:6.2f} CPU s/1k   "
          f"{1000 / cpu_ours:6.0f} req/s per core")
    print(f"    plain openai.AsyncOpenAI  {peer_rate:8.0f} req/s   {cpu_peer:6.2f} CPU s/1k   "
          f"{1000 / cpu_peer:6.0f} req/s per core")
    print(f"    throughput ratio          {ours_rate / peer_rate:8.2f}   (aim >= 1.0)")
    print(f"    CPU ratio                 {cpu_ours / cpu_peer:8.2f}   (aim <= 1.0)")
    print(f"    added CPU per request     {marg_ours - marg_peer:8.3f} ms (batchyard {marg_ours:.3f} ms, plain loop "
          f"{marg_peer:.3f} ms, start-up excluded: the {n} file less the {small_n} file; aim < 1 ms)")
    rss_ratio = med("ours", 1) / med("ours1k", 1)
    print(f"    peak RSS {small_n:,} lines {med('ours1k', 1) / mib:6.0f} MiB, {n:,} lines "
          f"{med('ours', 1) / mib:6.0f} MiB, ratio {rss_ratio:.2f}   (aim <= 1.1)")
    label = f"--workers {args.workers}" if args.workers is not None else "default workers"
    print(f"  batchyard run, {label}:")
    print(f"    {workers_rate:8.0f} req/s   {cpu_workers:6.2f} CPU s/1k   {1000 / cpu_workers:6.0f} req/s per core "
          f"(a 32-core box, if the upstream keeps up: ~{32 * 1000 / cpu_workers:.0f} req/s)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
