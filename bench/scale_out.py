"""Scale-out: one upstream batch run by 1, 2 and 4 `batchyard worker` processes.

Everything runs on this machine: a loopback upstream (tests/fakes/upstream/server.py), a
`redis-server`, the workers, and the API side (a `Runtime` from `open_shared`
in this process, hosting no routes). For each worker count it submits one
batch, times it from `create_batch` to `completed`, and reads Redis' INFO
commandstats before and after to give Redis commands per request.

    python -m bench.scale_out [--requests 20000] [--workers 1,2,4] [--latency-ms 20] [--s3]
    python -m bench.scale_out --redis-cluster 3 [--requests 20000] [--workers 2]

`--redis-cluster N`: each worker count runs on the single Redis and then on an N-master Redis Cluster on
this machine (`redis-server --cluster-enabled yes`, the URL naming one node), and the table gives the
cluster's throughput as a fraction of the single node's. Both share the same cores, so this shows the cost
of the cluster client and the slot-tagged keys, not a cluster's gain (the keys spread over the masters by
batch, team and queue: `gateway.store.redis.keys`). Also given, for either: Redis' peak memory
over its idle size while the batch ran, per million requests.

Not a test: CI does not run it. Numbers from a small shared machine measure the
gateway's overhead more than scale-out: the upstream, Redis and every worker
share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from gateway.config.schema import parse_config  # noqa: E402
from gateway.runtime.runtime import open_shared  # noqa: E402
from gateway.store.blobs.keys import file_key  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.services import (  # noqa: E402
    MotoS3,
    RedisClusterServers,
    RedisServer,
    shared_config,
    start_worker,
    write_config,
)

MODEL = "gpt-mini"


@dataclass
class Row:
    redis: str  # "single" or "cluster N"
    workers: int
    seconds: float
    commands: int
    top: list[tuple[str, int]]
    requests: int
    peak_bytes: int  # Redis' used memory at its peak during the batch, over its size before

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _nodes(server: RedisServer | RedisClusterServers) -> list[RedisServer]:
    return server.nodes if isinstance(server, RedisClusterServers) else [server]


def _commandstats(server: RedisServer | RedisClusterServers) -> dict[str, int]:
    calls: dict[str, int] = {}
    for node in _nodes(server):
        with node.client() as c:
            info = c.info("commandstats")
        for name, v in info.items():
            key = name.removeprefix("cmdstat_")
            calls[key] = calls.get(key, 0) + int(v["calls"])
    return calls


def _used_memory(server: RedisServer | RedisClusterServers) -> int:
    total = 0
    for node in _nodes(server):
        with node.client() as c:
            total += int(c.info("memory")["used_memory"])
    return total


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _one_batch(config_raw: dict, server: RedisServer | RedisClusterServers, storage: str,
                     n: int) -> tuple[float, int]:
    """Seconds from create to completed, and Redis' peak memory over its size before."""
    api = await open_shared(parse_config(config_raw), server.url, storage)
    base = peak = _used_memory(server)
    try:
        await api.start()
        lines = [
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}]}})
            for i in range(n)
        ]
        source = await api.service.upload_file("", "bench.jsonl", "batch", _chunks(("\n".join(lines) + "\n").encode()))
        started = time.monotonic()
        batch = await api.service.create_batch("", input_file_id=source.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
        while True:
            rec = await api.store.batches.get(batch.id)
            assert rec is not None
            peak = max(peak, _used_memory(server))
            if rec.status.finished:
                break
            await asyncio.sleep(0.5)
        elapsed = time.monotonic() - started
        if rec.counts.completed != n:
            sample = b""
            if rec.error_file_id:
                async for chunk in api.blobs.read(file_key(rec.error_file_id)):
                    sample += chunk
                    break
            raise SystemExit(f"batch ended {rec.status.value} with {rec.counts}: {sample[:600]!r}")
        return elapsed, peak - base
    finally:
        await api.aclose()


def run(args: argparse.Namespace) -> list[Row]:
    upstream = start_upstream(latency_ms=args.latency_ms)
    servers: list[tuple[str, RedisServer | RedisClusterServers]] = [("single", RedisServer().start())]
    if args.redis_cluster:
        servers.append((f"cluster {args.redis_cluster}", RedisClusterServers(args.redis_cluster).start()))
    s3 = MotoS3().start() if args.s3 else None
    env = s3.env() if s3 else {}
    os.environ.update(env)
    tmp = Path(tempfile.mkdtemp(prefix="scale-out-"))
    raw = shared_config(upstream.v1_url, (MODEL,), shard_size=args.shard_size,
                        max_concurrency=args.concurrency, max_lines=max(50_000, args.requests))
    raw["router_settings"] = {"num_retries": 3, "timeout": 60}  # the loopback upstream drops a connection now and then
    config_path = write_config(tmp / "config.yaml", raw)
    rows: list[Row] = []
    try:
        for count in args.workers:
            for kind, server in servers:
                server.flush()
                place = f"bench{count}-{kind.replace(' ', '')}"
                storage = s3.location(place) if s3 else str(tmp / place)
                workers = [start_worker(config_path, server.url, storage, env=env, claim_idle=30.0)
                           for _ in range(count)]
                try:
                    for w in workers:
                        w.wait_ready(timeout=120)
                    before = _commandstats(server)
                    seconds, peak = asyncio.run(_one_batch(raw, server, storage, args.requests))
                    after = _commandstats(server)
                finally:
                    for w in workers:
                        w.close()
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                top = sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:6]
                rows.append(Row(kind, count, seconds, sum(delta.values()), top, args.requests, peak))
                print(f"  {count} worker(s), {kind} Redis: {seconds:.1f}s", file=sys.stderr, flush=True)
    finally:
        upstream.stop()
        for _, server in servers:
            server.close()
        if s3:
            s3.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    p.add_argument("--latency-ms", type=float, default=20.0, help="the upstream's reply latency")
    p.add_argument("--shard-size", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=128, help="requests in flight per worker")
    p.add_argument("--s3", action="store_true", help="files in moto's S3 (default: a shared local directory)")
    p.add_argument("--redis-cluster", type=int, default=0, metavar="N",
                   help="also run each worker count on an N-master Redis Cluster (default: 0, none)")
    args = p.parse_args(argv)
    print(f"scale-out: {args.requests} requests, upstream latency {args.latency_ms:.0f} ms, shard size "
          f"{args.shard_size}, {args.concurrency} in flight per worker, storage {'S3 (moto)' if args.s3 else 'local'}; "
          f"{os.cpu_count()} CPU(s) shared by upstream, Redis and workers", file=sys.stderr, flush=True)
    rows = run(args)
    base = rows[0].rate
    single = {r.workers: r.rate for r in rows if r.redis == "single"}
    print(f"\n{'redis':>9} {'workers':>7} {'seconds':>8} {'req/s':>8} {'speed-up':>9} {'x single':>9} "
          f"{'redis cmds/req':>15} {'MB/1M req':>10}  top commands")
    for r in rows:
        top = ", ".join(f"{k} {v / r.requests:.2f}" for k, v in r.top)
        print(f"{r.redis:>9} {r.workers:>7} {r.seconds:>8.1f} {r.rate:>8.0f} {r.rate / base:>8.2f}x "
              f"{r.rate / single[r.workers]:>8.2f}x {r.commands / r.requests:>15.3f} "
              f"{r.peak_bytes / r.requests:>10.0f}  {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
