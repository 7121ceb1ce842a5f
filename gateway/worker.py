"""`batchyard worker`: run shards from the shared queue, on as many machines as you like.

    batchyard worker --config team.yaml --redis-url redis://redis:6379/0 \\
        --storage s3://bucket/batchyard [--models llama-3-8b]

A worker hosts every upstream route of the config, and the local models named
by `--models` (default: every local model of the config); it reads only those
routes' streams, so a local model's shards go only to the machines that load
it. Local engines start before the first shard is taken. SIGTERM or SIGINT
stops it: shards in flight keep the results recorded so far and are handed
back to the queue at once, for another worker to finish.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from gateway.config import Config, load_config
from gateway.distributed import open_shared
from gateway.errors import ConfigError
from gateway.loop import loop_factory
from gateway.routes import RouteKind
from gateway.server.metrics import worker_metrics
from gateway.store.redis_queue import DEFAULT_CLAIM_IDLE

EXIT_OK, EXIT_USAGE = 0, 2


def hosted_routes(config: Config, models: list[str] | None) -> list[str]:
    """The routes (model_names) a worker with `--models` runs shards for."""
    routes = {r.model_name: r for r in config.routes.values()}
    if models is None:
        return sorted(routes)
    unknown = [m for m in models if m not in config.routes]
    if unknown:
        raise ConfigError("command line", "--models", f"not in the config's model_list: {', '.join(unknown)}")
    local = {config.routes[m].model_name for m in models}
    return sorted({name for name, r in routes.items() if r.kind is not RouteKind.LOCAL} | local)


async def run_worker(
    config: Config, redis_url: str, storage: str, models: list[str] | None = None, *,
    claim_idle: float = DEFAULT_CLAIM_IDLE, metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
) -> int:
    routes = hosted_routes(config, models)
    pipeline = await open_shared(config, redis_url, storage, worker_routes=routes, claim_idle=claim_idle)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await pipeline.start(workers=True)  # starts every hosted backend (engines load) before taking shards
        async with worker_metrics(config, metrics_port, metrics_host):  # its own /metrics, with --metrics-port
            print(f"batchyard worker {pipeline.name}: running shards for {', '.join(routes)}", file=sys.stderr,
                  flush=True)
            await stop.wait()
        print(f"batchyard worker {pipeline.name}: stopping; handing shards in flight back", file=sys.stderr,
              flush=True)
    finally:
        await pipeline.aclose()
    return EXIT_OK


def run_worker_command(args: argparse.Namespace) -> int:
    """`batchyard worker` after argument parsing (see `gateway.cli`)."""
    if not args.redis_url:
        print("batchyard: worker needs --redis-url", file=sys.stderr)
        return EXIT_USAGE
    config = load_config(args.config)
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(run_worker(config, args.redis_url, args.storage, models, claim_idle=args.claim_idle,
                                     metrics_port=args.metrics_port, metrics_host=args.metrics_host))


__all__ = ["hosted_routes", "run_worker", "run_worker_command"]
