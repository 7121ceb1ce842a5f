"""Benchmark: `batchyard run` against a plain `openai.AsyncOpenAI` loop, same upstream, same concurrency.

    .venv/bin/python bench/upstream_fanout.py [--requests 20000] [--concurrency 64] [--repeat 3]

Both peers run as whole processes (imports included) against one loopback
upstream (tests/upstream.py), alternating, and the medians are compared. Also
prints batchyard's peak RSS at 1k lines and at N lines (flat memory means the
ratio stays near 1), and CPU seconds per 1,000 requests (user + sys of each
peer's whole process tree, worker processes included): unlike throughput, that
figure does not depend on the core count, and it is what a bigger machine
multiplies. Not a test: numbers on a shared 2-core machine are noisy.
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

from tests.upstream import start_upstream  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None,
                        help="batchyard run --workers for the throughput runs (default: the product's)")
    args = parser.parse_args()

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
        _write_input(small, 1_000)
        _write_input(big, args.requests)
        peer = tmp / "peer.py"
        peer.write_text(_PEER)

        def ours(src: Path, workers: int | None = args.workers) -> list[str]:
            extra = ["--workers", str(workers)] if workers is not None else []
            return [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp / "out.jsonl"),
                    "--config", str(config), "-q", *extra]

        theirs = [sys.executable, str(peer), str(big), str(tmp / "peer.jsonl"), upstream.v1_url,
                  str(args.concurrency)]
        walls_ours, walls_peer, cpu_ours, cpu_peer = [], [], [], []
        for i in range(args.repeat):
            w, _, cpu = _measure(ours(big))
            walls_ours.append(w)
            cpu_ours.append(cpu)
            w, _, cpu = _measure(theirs)
            walls_peer.append(w)
            cpu_peer.append(cpu)
            print(f"  run {i + 1}: batchyard {args.requests / walls_ours[-1]:7.0f} req/s "
                  f"{1000 * cpu_ours[-1] / args.requests:5.2f} CPU s/1k, "
                  f"AsyncOpenAI {args.requests / walls_peer[-1]:7.0f} req/s "
                  f"{1000 * cpu_peer[-1] / args.requests:5.2f} CPU s/1k", flush=True)
        # Memory at the same process count (one): a worker process's RSS is not growth.
        rss_small = [_measure(ours(small, 0))[1]]
        rss_big = [_measure(ours(big, 0))[1]]

    ours_rate = args.requests / statistics.median(walls_ours)
    peer_rate = args.requests / statistics.median(walls_peer)
    mib = 1024 * 1024
    print(f"\nupstream fan-out: {args.requests} chat requests, concurrency {args.concurrency}, "
          f"median of {args.repeat} (whole processes, imports included)")
    print(f"  batchyard run              {ours_rate:8.0f} req/s")
    print(f"  plain openai.AsyncOpenAI   {peer_rate:8.0f} req/s")
    print(f"  ratio batchyard/openai     {ours_rate / peer_rate:8.2f}   (aim >= 0.9)")
    cpu_ours_k = 1000 * statistics.median(cpu_ours) / args.requests
    cpu_peer_k = 1000 * statistics.median(cpu_peer) / args.requests
    print(f"  CPU s per 1k requests      {cpu_ours_k:8.2f}   batchyard (whole process tree, start-up included)")
    print(f"                             {cpu_peer_k:8.2f}   plain openai.AsyncOpenAI")
    print(f"  CPU ratio batchyard/openai {cpu_ours_k / cpu_peer_k:8.2f}")
    print(f"  batchyard peak RSS  1k lines {statistics.median(rss_small) / mib:8.0f} MiB   (--workers 0, one process)")
    print(f"  batchyard peak RSS {args.requests // 1000}k lines {statistics.median(rss_big) / mib:8.0f} MiB")
    ratio = statistics.median(rss_big) / statistics.median(rss_small)
    print(f"  RSS ratio {args.requests // 1000}k/1k          {ratio:8.2f}   (aim <= 1.25)")


if __name__ == "__main__":
    main()
