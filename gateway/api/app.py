"""The HTTP front door: OpenAI's Files and Batches API over the runtime.

One router, mounted where each client family looks for it: `/v1` (OpenAI,
LiteLLM), the root (`/files`, `/batches`: LiteLLM's clients and its proxy),
`/openai` (AzureOpenAI; `?api-version=` is accepted and ignored), `/openai/v1`
(Azure's v1 form) and `/azure/v1` (LiteLLM's Azure form). Anthropic's Message Batches are mounted at
`/v1/messages` (`gateway.api.message_batches`). Every response
carries an `x-request-id` (`gateway.api.request_id`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from gateway import tracing
from gateway.api import batches, dashboard, estimate, files, scrape, spend, uploads
from gateway.api.auth import Authenticator, current_principal, log_auth_mode
from gateway.api.deps import Caller, check_api_version, runtime_of
from gateway.api.http_errors import ApiError, error_response, install_error_handlers
from gateway.api.message_batches import message_batches_app
from gateway.api.request_id import RequestIdMiddleware
from gateway.pipeline.message_batch_create import remove_stale_spools

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime
    from gateway.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

PREFIXES = ("/v1", "", "/openai", "/openai/v1", "/azure/v1")

_models = APIRouter()


@_models.get("/models")
async def list_models(request: Request, caller: Caller) -> JSONResponse:
    created: int = request.app.state.started_at
    config = runtime_of(request).config
    data = [  # every model_name (a wildcard as its pattern, as LiteLLM lists it) and each alias not hidden
        {"id": name, "object": "model", "created": created, "owned_by": "batchyard"}
        for name in config.listed_models()
        if caller.may_use(name) or ((route := config.route(name)) is not None and caller.may_use(route.model_name))
    ]
    return JSONResponse({"object": "list", "data": data})


_health = APIRouter()


@_health.get("/health")
@_health.get("/health/liveliness")
@_health.get("/health/liveness")
async def health(request: Request) -> JSONResponse:
    return await _health_reply(request)


@_health.get("/health/readiness")
async def readiness(request: Request) -> JSONResponse:
    return await _health_reply(request)


def _is_admin(request: Request) -> bool:
    """Whether the caller holds the master key (or the server has no keys: open, as every route)."""
    try:
        return current_principal(request).admin
    except ApiError:  # no key or a wrong one: a probe still learns whether the service is up
        return False


async def _health_reply(request: Request) -> JSONResponse:
    """Up or not, for anyone (probes send no key): `{"status": "healthy"}`, or 503. The details (mode,
    queue depth per route, workers with their hosts and pids, an error's text) only for the master key."""
    admin = _is_admin(request)
    info: Any = None
    try:
        info = await runtime_of(request).health()
    except Exception as exc:
        log.warning("health check failed: %s", exc)
        return error_response(503, f"unhealthy: {exc}" if admin else "unhealthy", code="unhealthy")
    body: dict[str, Any] = {"status": "healthy"}
    notices = runtime_of(request).config.notices
    if admin and notices:  # the LiteLLM settings of the config that batchyard does not apply
        body["config_notices"] = [str(notice) for notice in notices]
    if isinstance(info, dict):
        if admin:
            body.update({k: v for k, v in info.items() if k != "status"})
        if info.get("status") not in (None, "healthy", "ok"):
            body["status"] = info["status"]
            return JSONResponse(body, status_code=503)
    elif info is not None and admin:
        body["info"] = info
    return JSONResponse(body)


def _api_router() -> APIRouter:
    router = APIRouter(dependencies=[Depends(check_api_version)])
    router.include_router(files.router)
    router.include_router(uploads.router)
    router.include_router(estimate.router)
    router.include_router(batches.router)
    router.include_router(spend.router)
    router.include_router(_models)
    return router


def create_app(runtime: Runtime, *, manage_runtime: bool = False, workers: Supervisor | None = None,
               on_started: Callable[[], None] | None = None) -> FastAPI:
    """The ASGI app over `runtime`.

    With `manage_runtime`, the app's lifespan starts the runtime (and the worker
    processes) and closes them on shutdown (what `serve` uses, so SIGTERM closes
    them cleanly); otherwise the caller owns the runtime's life. `on_started` is
    called once the lifespan has started everything (`serve`: the start-up heap frozen).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_auth_mode(app.state.auth)
        if manage_runtime:
            remove_stale_spools()  # a Message Batch create's, left by an API process killed mid-create
            await runtime.start()
            if workers is not None:
                await workers.start()
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            if manage_runtime:
                if workers is not None:
                    await workers.aclose()
                await runtime.aclose()

    app = FastAPI(
        title="batchyard",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.auth = Authenticator(runtime.config)
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    # Anthropic's Message Batches: an app of its own, so that its errors are Anthropic's
    app.mount("/v1/messages", message_batches_app(app))
    api = _api_router()
    for prefix in PREFIXES:
        app.include_router(api, prefix=prefix)
    app.include_router(_health)
    dashboard.install(app)
    scrape.install(app)
    # a SERVER span per request, with tracing on (gateway.tracing.api_spans); the caller's trace a link on it
    tracing.instrument_app(app, trust_caller_trace=runtime.config.batch.trust_caller_trace)
    return app
