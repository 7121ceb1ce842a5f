"""`serve`: the runtime behind uvicorn.

Embedded (the default): the runtime over `data_dir` (SQLite records, queue and
leases, a local blob directory). The API process serves HTTP and sweeps; new
batches are validated in processes of their own (`gateway.runtime.validation_processes`),
so that a large upload never stalls another team's API calls; `workers` worker
processes (default: one per free core, `gateway.runtime.supervisor.default_workers`) run the shards.
With `workers=0` the API process runs them itself. Everything is started by the
app's lifespan and closed when uvicorn shuts down on SIGTERM or SIGINT. A
restart over the same `data_dir` resumes unfinished batches.

The command line is `batchyard serve` (`gateway.cli.main`: its flags, their defaults, and the
refusal of a flag the chosen mode would not use); this module has no parser of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from gateway import tracing
from gateway.cli.heap import StartupHeap
from gateway.config.litellm.notices import notice_text
from gateway.config.schema import Config, load_config
from gateway.errors import ConfigError
from gateway.log_safe import escape_every_handler
from gateway.runtime.loop import loop_factory

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime

log = logging.getLogger("gateway.cli.serve")  # not "__main__" under python -m

# Builds the runtime instead of the embedded one (the shared mode's `serve_shared`).
RuntimeFactory = Callable[[Config], Awaitable["Runtime"]]

async def _serve(
    config_path: str | Path,
    host: str,
    port: int,
    data_dir: Path | None,
    log_level: str,
    runtime_factory: RuntimeFactory | None = None,
    workers: int | None = None,
    heap: StartupHeap | None = None,
    forwarded_allow_ips: str | None = None,
) -> None:
    from gateway.api.app import create_app
    from gateway.runtime.runtime import open_embedded  # the runtime imports the backends: only when serving
    from gateway.runtime.supervisor import Supervisor, default_workers
    from gateway.runtime.validation_processes import VALIDATION_PROCESSES

    config = load_config(config_path)
    tracing.start_process("api", config.batch.tracing)  # before the app: its SERVER spans need the provider
    pool: Supervisor | None = None
    refused: list[str] = []  # what a worker said of a config it cannot use: serve stops and says it (exit 2)

    def config_refused(said: str) -> None:
        refused.append(said)
        server.should_exit = True

    if runtime_factory is not None:
        runtime, where = await runtime_factory(config), "shared store"
    else:
        if data_dir is None:
            raise ValueError("embedded serve needs a data directory")
        count = default_workers(config, serving=True) if workers is None else workers
        runtime = await open_embedded(config, data_dir, routes=() if count else None,
                                      validation_processes=VALIDATION_PROCESSES)
        where = f"data in {data_dir}, " + (f"{count} worker process(es)" if count else "shards run in this process")
        if count:
            from gateway.metrics import MULTIPROC_ENV

            # One metrics directory for this process and its workers (they inherit it), so the API's
            # /metrics counts what they did. Set before any metric exists in this process.
            os.environ.setdefault(MULTIPROC_ENV, str(data_dir / "metrics"))
            pool = runtime.worker_pool(count, config_path=str(config_path), verbose=log_level == "debug",
                                       on_config_error=config_refused)
    app = create_app(runtime, manage_runtime=True, workers=pool, on_started=heap.freeze if heap else None)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=False,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=10,
            server_header=False,
            # uvicorn's ProxyHeadersMiddleware: the scheme and client of a request through a trusted proxy
            # (the dashboard's Secure cookie and same-origin check read the scheme). None: uvicorn's default.
            proxy_headers=True,
            forwarded_allow_ips=forwarded_allow_ips,
        )
    )
    escape_every_handler("uvicorn", "uvicorn.error", "uvicorn.access")  # uvicorn's Config set its handlers up
    log.info("batchyard serving on http://%s:%d (%s)", host, port, where)
    if config.notices:  # once, at start (and in /health for the master key)
        log.warning("%s", notice_text(config.notices))
    log.debug("routes: %s", ", ".join(f"{name} ({route.kind.value})" for name, route in sorted(config.routes.items())))
    await server.serve()
    if refused:
        path, key, problem = [*refused[0].split(": ", 2), "", ""][:3]
        raise ConfigError(path, key, problem) if problem else ConfigError(str(config_path), "model_list", refused[0])


def _quiet_libraries(log_level: str) -> None:
    # LiteLLM logs every request at INFO (twice: its own handler and ours); keep its warnings and errors.
    if log_level != "debug":
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)


def serve(
    config_path: str | Path,
    host: str,
    port: int,
    data_dir: str | Path | None = None,
    *,
    log_level: str = "info",
    runtime_factory: RuntimeFactory | None = None,
    workers: int | None = None,
    forwarded_allow_ips: str | None = None,
) -> None:
    """Run the gateway until SIGTERM/SIGINT; raises `ConfigError` for a bad config.

    `data_dir`: the embedded store's directory; None only with a `runtime_factory` (shared mode).
    """
    # force: the level asked for wins over any logging set up before (a caller's, or a library's import)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    escape_every_handler()
    _quiet_libraries(log_level)
    heap = StartupHeap()  # `serve` is a process of its own: its start-up heap is frozen once it has started
    heap.pause()
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            where = Path(data_dir) if data_dir is not None else None
            runner.run(_serve(config_path, host, port, where, log_level, runtime_factory, workers, heap,
                              forwarded_allow_ips))
    finally:
        heap.resume()


def serve_shared(
    config_path: str | Path, host: str, port: int, *, redis_url: str, blobs: str | Path,
    with_worker: bool = False, claim_idle: float | None = None, log_level: str = "info",
    redis_ca_file: str | None = None, allow_evicting_redis: bool = False, forwarded_allow_ips: str | None = None,
) -> None:
    """`batchyard serve --redis-url U --blobs s3://…`: one API replica over the shared store."""

    async def factory(config: Config) -> Runtime:
        from gateway.runtime.runtime import open_shared
        from gateway.runtime.validation_processes import VALIDATION_PROCESSES

        return await open_shared(config, redis_url, blobs, routes=None if with_worker else (),
                                 claim_idle=claim_idle, validation_processes=VALIDATION_PROCESSES,
                                 redis_ca_file=redis_ca_file, allow_evicting_redis=allow_evicting_redis)

    serve(config_path, host, port, log_level=log_level, runtime_factory=factory,
          forwarded_allow_ips=forwarded_allow_ips)
