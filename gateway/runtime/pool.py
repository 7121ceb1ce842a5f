"""`BackendPool`: one started `Backend` per route, created on first use.

Every upstream route shares one LiteLLM backend (one Router, one concurrency
bound); each local model gets its own engine, started once and shared by every
shard that needs it; native routes share the provider-batch backend.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Collection
from typing import Any

from gateway.backends.interface import Backend, BackendUnavailable, RouteReporter
from gateway.config.native_declarations import Declarations, declare_native
from gateway.config.routes import Route, RouteKind
from gateway.config.schema import Config
from gateway.store.protocols import Coordination, Store


def _native_catalog() -> Declarations:
    from providers.native.catalog import native_catalog

    return native_catalog()


def declare_native_providers() -> None:
    """Hand the native providers' declarations (their jobs classes) to the config: the composition root knows
    the implementations, the config may not import them. Nothing is imported until a native entry is read."""
    declare_native(_native_catalog)


class BackendPool:
    def __init__(self, config: Config, store: Store, coordination: Coordination | None = None,
                 worker: str = "") -> None:
        """`coordination`: where background routes' workers share their concurrency (None: in this process)."""
        self._config = config
        self._store = store
        self._coordination, self._worker = coordination, worker
        self._created: dict[str, Backend] = {}
        self._starting: dict[int, asyncio.Task[None]] = {}  # by id(backend): one start per backend, shared
        self._upstream: Backend | None = None
        self._unavailable: dict[str, BackendUnavailable] = {}  # route -> why it could not start (for good)

    def _upstream_backend(self) -> Backend:
        if self._upstream is None:
            from providers.litellm_backend import LiteLLMBackend

            routes = [r for r in self._unique_routes() if r.kind is RouteKind.UPSTREAM]
            self._upstream = LiteLLMBackend(
                routes, self._config.router_settings, self._config.batch.max_concurrency,
                litellm_settings=self._config.litellm_settings, resolve=self._config.route,
                max_reply_bytes=self._config.batch.max_passthrough_reply_bytes,
                shares=self._coordination, worker=self._worker,
            )
        return self._upstream

    def _unique_routes(self) -> list[Route]:
        seen: dict[str, Route] = {}
        for route in self._config.routes.values():
            seen.setdefault(route.model_name, route)
        return list(seen.values())

    def _create(self, route: Route) -> Backend:
        if route.kind is RouteKind.UPSTREAM:
            return self._upstream_backend()
        if route.kind is RouteKind.LOCAL:
            from local_engine import LocalEngineBackend

            return LocalEngineBackend(route.engine_args, allowed_params=route.allowed_params,
                                      allowed_media_domains=route.allowed_media_domains)
        from providers.native.runner import NativeBatchBackend

        return NativeBatchBackend(route, self._config.router_settings, self._store)

    @property
    def routes(self) -> frozenset[str]:
        return frozenset(self._config.routes)

    def peek(self, route_name: str) -> Backend:
        """The route's backend, not started (for its hooks: no engine loads, no Router is built)."""
        backend = self._created.get(route_name)
        if backend is None:
            route = self._config.route(route_name)  # a wildcard route's concrete model too
            if route is None:
                raise KeyError(route_name)
            backend = self._created[route_name] = self._create(route)
        return backend

    def reporter(self, route_name: str) -> RouteReporter | None:
        """The route's backend if it summarises its route for the finalizer (the `RouteReporter` hook)."""
        if self._config.route(route_name) is None:
            return None
        backend = self.peek(route_name)
        return backend if isinstance(backend, RouteReporter) else None

    async def get(self, route_name: str) -> Backend:
        """The started backend for a route (by its model_name).

        Routes start independently: two local engines load side by side, and a
        shard of an upstream route never waits for an engine to load.
        """
        if route_name in self._unavailable:
            raise self._unavailable[route_name]
        backend = self.peek(route_name)
        task = self._starting.get(id(backend))
        if task is None:
            task = self._starting[id(backend)] = asyncio.ensure_future(backend.start())
        try:
            await asyncio.shield(task)  # one caller giving up must not cancel the start the others wait on
        except BackendUnavailable as exc:
            self._unavailable[route_name] = exc  # starting again would fail again: the route stops alone
            raise
        except Exception:
            # a failed start is retried by the next caller (a shard attempt), not cached for good
            if self._starting.get(id(backend)) is task:
                del self._starting[id(backend)]
            raise
        return backend

    async def warm_up(self, routes: Collection[str] | None = None) -> None:
        """Import LiteLLM (seconds of work) in a thread when a route needs it, so the first shard
        doesn't stall the event loop. `routes`: the ones this process hosts (None: all)."""
        wanted = [r for r in self._config.routes.values() if routes is None or r.model_name in routes]
        if any(r.kind is not RouteKind.LOCAL for r in wanted):
            await asyncio.to_thread(importlib.import_module, "litellm")

    def pacing(self) -> dict[str, dict[str, Any]]:
        """route -> its pacing in this process, for each background route that has run (`providers.background`)."""
        pacing = getattr(self._upstream, "pacing", None)
        return dict(pacing()) if pacing is not None else {}

    @property
    def unavailable(self) -> dict[str, str]:
        """route -> why its backend could not start (for good)."""
        return {route: str(exc) for route, exc in self._unavailable.items()}

    async def start_local(self) -> None:
        """Start every local engine now, side by side (fail fast on a bad model path, before any request)."""
        local = [r.model_name for r in self._unique_routes() if r.kind is RouteKind.LOCAL]
        await asyncio.gather(*(self.get(name) for name in local))

    async def aclose(self) -> None:
        backends = {id(b): b for b in self._created.values()}
        self._created.clear()
        self._upstream = None
        starting, self._starting = list(self._starting.values()), {}
        for task in starting:
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        for backend in backends.values():
            await backend.aclose()
