"""Scale-out: one upstream batch run by 1, 2 and 4 `batchyard worker` processes.

Everything runs on this machine: a loopback upstream (tests/fakes/upstream/server.py), a
`redis-server`, the workers, and the API side (a `Runtime` from `open_shared`
in this process, hosting no routes). For each worker count it submits one
batch, times it from `create_batch` to `completed`, and reads Redis' INFO
commandstats before and after to give Redis commands per request.

    python -m bench.scale_out [--requests 20000] [--workers 1,2,4] [--latency-ms 20] [--s3]

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

from gateway.blob_keys import file_key  # noqa: E402
from gateway.config.schema import parse_config  # noqa: E402
from gateway.runtime.runtime import open_shared  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.services import MotoS3, RedisServer, shared_config, start_worker, write_config  # noqa: E402

MODEL = "gpt-mini"


@dataclass
class Row:
    workers: int
    seconds: float
    commands: int
    top: list[tuple[str, int]]
    requests: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _commandstats(server: RedisServer) -> dict[str, int]:
    with server.client() as c:
        info = c.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _one_batch(config_raw: dict, redis_url: str, storage: str, n: int) -> float:
    api = await open_shared(parse_config(config_raw), redis_url, storage)
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
        return elapsed
    finally:
        await api.aclose()


def run(args: argparse.Namespace) -> list[Row]:
    upstream = start_upstream(latency_ms=args.latency_ms)
    redis_server = RedisServer().start()
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
            with redis_server.client() as c:
                c.flushall()
            storage = s3.storage(f"bench{count}") if s3 else str(tmp / f"blobs{count}")
            workers = [start_worker(config_path, redis_server.url, storage, env=env, claim_idle=30.0)
                       for _ in range(count)]
            try:
                for w in workers:
                    w.wait_ready(timeout=120)
                before = _commandstats(redis_server)
                seconds = asyncio.run(_one_batch(raw, redis_server.url, storage, args.requests))
                after = _commandstats(redis_server)
            finally:
                for w in workers:
                    w.close()
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            top = sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:6]
            rows.append(Row(count, seconds, sum(delta.values()), top, args.requests))
            print(f"  {count} worker(s): {seconds:.1f}s", file=sys.stderr, flush=True)
    finally:
        upstream.stop()
        redis_server.close()
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
    args = p.parse_args(argv)
    print(f"scale-out: {args.requests} requests, upstream latency {args.latency_ms:.0f} ms, shard size "
          f"{args.shard_size}, {args.concurrency} in flight per worker, storage {'S3 (moto)' if args.s3 else 'local'}; "
          f"{os.cpu_count()} CPU(s) shared by upstream, Redis and workers", file=sys.stderr, flush=True)
    rows = run(args)
    base = rows[0].rate
    print(f"\n{'workers':>7} {'seconds':>8} {'req/s':>8} {'speed-up':>9} {'redis cmds/req':>15}  top commands")
    for r in rows:
        top = ", ".join(f"{k} {v / r.requests:.2f}" for k, v in r.top)
        print(f"{r.workers:>7} {r.seconds:>8.1f} {r.rate:>8.0f} {r.rate / base:>8.2f}x {r.commands / r.requests:>15.3f}"
              f"  {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
