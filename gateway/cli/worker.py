"""`batchyard worker`: a process that runs shards, on this machine or on as many as you like.

    batchyard worker --config team.yaml --redis-url redis://redis:6379/0 \\
        --blobs s3://bucket/batchyard [--models llama-3-8b]        # shared mode
    batchyard worker --config team.yaml --data-dir .batchyard/data   # embedded mode (what serve starts)

A worker hosts every upstream route of the config, and the local models named
by `--models` (default: every local model of the config; none with
`--upstream-only`); it takes only those routes' shards, so a local model's
shards go only to the process that loads it. Local engines start before the
first shard is taken. SIGTERM or SIGINT stops it: shards in flight keep the
results recorded so far and are handed back to the queue at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from gateway import metrics, tracing
from gateway.api.scrape import worker_metrics
from gateway.cli.heap import StartupHeap
from gateway.config.litellm.notices import notice_text
from gateway.config.routes import RouteKind
from gateway.config.schema import Config, load_config
from gateway.errors import ConfigError
from gateway.runtime.loop import loop_factory
from gateway.runtime.runtime import Runtime, open_embedded, open_shared
from gateway.runtime.supervisor import watch_parent

EXIT_OK, EXIT_USAGE = 0, 2


def hosted_routes(config: Config, models: list[str] | None, *, upstream_only: bool = False) -> list[str]:
    """The routes (model_names) a worker with `--models` runs shards for."""
    routes = {r.model_name: r for r in config.routes.values()}
    upstream = {name for name, r in routes.items() if r.kind is not RouteKind.LOCAL}
    if upstream_only:
        return sorted(upstream)
    if models is None:
        return sorted(routes)
    unknown = [m for m in models if config.route(m) is None]
    if unknown:
        raise ConfigError("command line", "--models", f"not in the config's model_list: {', '.join(unknown)}")
    return sorted(upstream | {config.lane(m) for m in models})  # a wildcard's models queue under its pattern


async def run_worker(
    runtime: Runtime, *, parent_pid: int | None = None, metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1", heap: StartupHeap | None = None,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = watch_parent(parent_pid, stop) if parent_pid else None
    metrics.prepare_instruments()  # its metrics files now, while the disk has room
    try:
        await runtime.start()  # starts every hosted backend (engines load) before taking shards
        if heap is not None:
            heap.freeze()
        async with worker_metrics(runtime.config, metrics_port, metrics_host):  # its own /metrics (--metrics-port)
            print(f"batchyard worker {runtime.name}: running shards for {', '.join(runtime.hosted) or 'no route'}",
                  file=sys.stderr, flush=True)
            await stop.wait()
        print(f"batchyard worker {runtime.name}: stopping; handing shards in flight back", file=sys.stderr,
              flush=True)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await runtime.aclose()
    return EXIT_OK


async def _open(args: argparse.Namespace, config: Config) -> Runtime:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    routes = hosted_routes(config, models, upstream_only=args.upstream_only)
    if args.redis_url:
        return await open_shared(config, args.redis_url, args.blobs, routes=routes, claim_idle=args.claim_idle,
                                 redis_ca_file=args.redis_ca_file, allow_evicting_redis=args.allow_evicting_redis)
    # The owner (serve, run) sweeps and recovers; its workers only run shards.
    return await open_embedded(config, Path(args.data_dir), routes=routes, owner=False)


def run_worker_command(args: argparse.Namespace) -> int:
    """`batchyard worker` after argument parsing (see `gateway.cli.main`)."""
    if not args.redis_url and not args.data_dir:
        print("batchyard: worker needs --redis-url (shared mode) or --data-dir (embedded mode)", file=sys.stderr)
        return EXIT_USAGE
    config = load_config(args.config, strict=args.strict_config)
    if config.notices and args.parent_pid is None:  # a worker that serve or run started: they said it
        print(f"batchyard: {notice_text(config.notices)}", file=sys.stderr)

    tracing.start_process("worker", config.batch.tracing)
    heap = StartupHeap()  # a process of its own: its start-up heap is frozen once its backends have started
    heap.pause()

    async def main() -> int:
        return await run_worker(await _open(args, config), parent_pid=args.parent_pid,
                                metrics_port=args.metrics_port, metrics_host=args.metrics_host, heap=heap)

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main())
    finally:
        heap.resume()


__all__ = ["hosted_routes", "run_worker", "run_worker_command"]
