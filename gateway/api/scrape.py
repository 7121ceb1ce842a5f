"""`GET /metrics`: the Prometheus scrape, and a worker's own scrape on `--metrics-port`.

`batch_settings.metrics` decides: `enabled: false` answers 404; with
`require_auth` (the default) only the master key may scrape (401 without a key
or with a wrong one, 403 for a team's key). A server with no key configured is
open, this route too.

An API process adds the gauges of shared state (queue depth per route, batches
by status) read from the Queue and the Store at scrape time. A worker's own
scrape leaves them out: the API replicas report them, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from gateway import metrics
from gateway.api.auth import Authenticator, current_principal
from gateway.api.http_errors import ApiError, install_error_handlers
from gateway.api.teams_view import team_states
from gateway.config.schema import Config

log = logging.getLogger("batchyard.metrics")

router = APIRouter()

_STATE_TIMEOUT = 10.0  # seconds a scrape waits for the Store and the Queue


@router.get("/metrics")
async def scrape(request: Request) -> Response:
    runtime = request.app.state.runtime
    config: Config = runtime.config
    if not config.batch.metrics.enabled:
        raise HTTPException(404)
    if config.batch.metrics.require_auth and not current_principal(request).admin:
        raise ApiError(403, "Only the master key may read /metrics.", type_="permission_error",
                       code="insufficient_permissions")
    shared: metrics.SharedState | None = None
    if getattr(request.app.state, "metrics_shared_state", True):
        routes = sorted({route.model_name for route in config.routes.values()})
        try:
            shared = await asyncio.wait_for(
                metrics.read_shared_state(runtime.store, getattr(runtime, "queue", None), routes), _STATE_TIMEOUT
            )
            if hasattr(runtime, "budgets"):
                shared.teams = await asyncio.wait_for(team_states(runtime), _STATE_TIMEOUT)
        except Exception as exc:  # the process's own counters are still worth a scrape
            log.warning("metrics: could not read queue depth and batch counts: %s", exc)
    body, content_type = metrics.render(shared, request.headers.get("accept"))
    return Response(body, media_type=content_type)


def install(app: FastAPI) -> None:
    """Mount `/metrics` on the API app (at server start: stale multiprocess files go first)."""
    metrics.prepare_multiprocess_dir()
    metrics.prepare_instruments()
    config: Config = app.state.runtime.config
    settings = config.batch.metrics
    if settings.enabled and settings.require_auth and config.auth_enabled and not config.master_key:
        log.warning("metrics: require_auth is on but general_settings.master_key is not set: nobody can scrape "
                    "/metrics (set a master key, or batch_settings.metrics.require_auth: false)")
    app.include_router(router)


@contextlib.asynccontextmanager
async def worker_metrics(config: Config, port: int | None, host: str = "127.0.0.1") -> AsyncIterator[None]:
    """While inside: a worker's own `/metrics` on `host:port` (nothing when `port` is None or metrics are off)."""
    if port is None:
        yield
        return
    if not config.batch.metrics.enabled:
        log.warning("metrics: --metrics-port given but batch_settings.metrics.enabled is false; not serving")
        yield
        return

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = _ConfigOnly(config)
    app.state.auth = Authenticator(config)
    app.state.metrics_shared_state = False
    install_error_handlers(app)
    app.include_router(router)
    server = _QuietServer(uvicorn.Config(app, host=host, port=port, access_log=False, log_level="warning",
                                         lifespan="off", server_header=False))
    task = asyncio.create_task(server.serve(), name="metrics-server")
    while not server.started:
        if task.done():
            task.result()  # e.g. the port is taken: fail the worker's start, loudly
            raise RuntimeError(f"the metrics server on {host}:{port} stopped at start")
        await asyncio.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task


class _ConfigOnly:
    """What the scrape route reads of a runtime, for a worker's metrics app."""

    def __init__(self, config: Config) -> None:
        self.config = config


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the worker owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


__all__ = ["install", "router", "worker_metrics"]
