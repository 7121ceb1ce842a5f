"""`serve`: the embedded pipeline behind uvicorn.

The pipeline (SQLite + a local directory + an in-process queue under
`data_dir`) is opened here, started by the app's lifespan and closed when
uvicorn shuts down on SIGTERM or SIGINT. A restart over the same `data_dir`
resumes unfinished batches.

    python -m gateway.server.run --config CONFIG [--host H] [--port P] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from gateway.config import Config, load_config
from gateway.errors import ConfigError
from gateway.loop import loop_factory

if TYPE_CHECKING:
    from gateway.pipeline import Pipeline

log = logging.getLogger("gateway.server.run")  # not "__main__" under python -m

# Builds the pipeline instead of the embedded one (shared mode: `gateway.distributed.serve_shared`).
PipelineFactory = Callable[[Config], Awaitable["Pipeline"]]

DEFAULT_HOST, DEFAULT_PORT, DEFAULT_DATA_DIR = "127.0.0.1", 4000, ".batchyard"


async def _serve(
    config_path: str | Path,
    host: str,
    port: int,
    data_dir: Path,
    log_level: str,
    pipeline_factory: PipelineFactory | None = None,
) -> None:
    from gateway.pipeline import open_embedded  # the pipeline imports the backends: only when serving
    from gateway.server.app import create_app

    config = load_config(config_path)
    if pipeline_factory is not None:
        pipeline, where = await pipeline_factory(config), "shared store"
    else:
        pipeline, where = await open_embedded(config, data_dir), f"data in {data_dir}"
    app = create_app(pipeline, manage_pipeline=True)
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
        )
    )
    log.info("batchyard serving on http://%s:%d (%s)", host, port, where)
    await server.serve()


def _quiet_libraries(log_level: str) -> None:
    # LiteLLM logs every request at INFO (twice: its own handler and ours); keep its warnings and errors.
    if log_level != "debug":
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)


def serve(
    config_path: str | Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: str | Path = DEFAULT_DATA_DIR,
    *,
    log_level: str = "info",
    pipeline_factory: PipelineFactory | None = None,
) -> None:
    """Run the gateway until SIGTERM/SIGINT; raises `ConfigError` for a bad config."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _quiet_libraries(log_level)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(config_path, host, port, Path(data_dir), log_level, pipeline_factory))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.server.run", description="Serve the batchyard API.")
    parser.add_argument("--config", required=True, help="LiteLLM-style YAML config")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--data-dir", default=os.environ.get("BATCHYARD_DATA_DIR", DEFAULT_DATA_DIR))
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    try:
        serve(args.config, args.host, args.port, args.data_dir, log_level=args.log_level)
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
