"""Upstream providers in real time, through one LiteLLM `Router`.

The Router is built from every upstream entry of `model_list`: it does the
retries (with backoff, honouring Retry-After), rpm/tpm limits, cooldowns and
load balancing over several deployments of one `model_name`. This module only
maps a batch line to the Router call for its endpoint and the reply (or the
provider's error, `providers.upstream_errors`) back to a `Result`, priced
(`providers.upstream_cost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway.backends.interface import run_bounded
from gateway.config.routes import Route
from gateway.records import BatchRequest, Endpoint, Result
from providers import litellm_setup
from providers.upstream_cost import Prices
from providers.upstream_errors import UPSTREAM_ERROR, provider_error

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map at import

log = logging.getLogger("batchyard.providers")

# Router settings that are ours to default; the config's router_settings win, and
# litellm_settings.num_retries / request_timeout take the place of ours when given.
_ROUTER_DEFAULTS: dict[str, Any] = {"num_retries": 3, "timeout": 600, "retry_after": 0}
_LITELLM_FOR_ROUTER = {"num_retries": "num_retries", "timeout": "request_timeout"}

# endpoint -> the Router method's name
_METHODS: dict[Endpoint, str] = {
    Endpoint.CHAT: "acompletion",
    Endpoint.COMPLETIONS: "atext_completion",
    Endpoint.EMBEDDINGS: "aembedding",
    Endpoint.RESPONSES: "aresponses",
    Endpoint.RERANK: "arerank",
    Endpoint.MODERATIONS: "amoderation",
    Endpoint.IMAGES: "aimage_generation",
}

# endpoint -> the body fields the Router method takes as required arguments: a line
# without one gets OpenAI's missing-parameter error instead of a TypeError from LiteLLM.
_REQUIRED: dict[Endpoint, tuple[str, ...]] = {
    Endpoint.CHAT: ("messages",),
    Endpoint.COMPLETIONS: ("prompt",),
    Endpoint.EMBEDDINGS: ("input",),
    Endpoint.RESPONSES: ("input",),
    Endpoint.RERANK: ("query", "documents"),
    Endpoint.MODERATIONS: ("input",),
    Endpoint.IMAGES: ("prompt",),
}


def router_kwargs(router: dict[str, Any], litellm_settings: dict[str, Any]) -> dict[str, Any]:
    """The Router's keyword arguments: the config's, then ours where neither section sets the value."""
    settings = dict(router)
    for key, default in _ROUTER_DEFAULTS.items():
        if key not in settings and _LITELLM_FOR_ROUTER.get(key, "") not in litellm_settings:
            settings[key] = default
    return settings


class LiteLLMBackend:
    """One backend for every upstream route: they share the Router and its limits."""

    endpoints = frozenset(_METHODS)

    def __init__(
        self,
        routes: Sequence[Route],
        router_settings: dict[str, Any],
        max_concurrency: int,
        litellm_settings: dict[str, Any] | None = None,
    ) -> None:
        self._model_list = [
            {k: v for k, v in entry.items() if k in ("model_name", "litellm_params", "model_info")}
            for route in routes
            for entry in route.deployments
        ]
        self._litellm_settings = dict(litellm_settings or {})
        self._settings = router_kwargs(router_settings, self._litellm_settings)
        self._limit = asyncio.Semaphore(max_concurrency)
        self._router: Any = None
        self._prices = Prices(())

    async def start(self) -> None:
        if self._router is not None:
            return
        from litellm import Router

        litellm_setup.apply(self._litellm_settings)
        # Building a Router does seconds of synchronous work on first use: keep it off the event loop.
        self._router = await asyncio.to_thread(Router, model_list=self._model_list, **self._settings)
        self._prices = Prices(self._router.model_list)  # by the deployment ids the Router gave

    async def aclose(self) -> None:
        if self._router is None:
            return
        self._router = None
        await litellm_setup.close_clients()

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        await self.start()
        # aclosing: closing this iterator must close the inner one now, not at garbage collection
        async with contextlib.aclosing(run_bounded(requests, self._call, self._limit)) as results:
            async for result in results:
                yield result

    async def _call(self, req: BatchRequest) -> Result:
        body = dict(req.body)
        model = body.pop("model")
        call = self._method(req.url)
        if call is None:
            return Result.http_error(req.line, req.custom_id, 400, f"{req.url.value} is not supported for upstream "
                                     "models", type_="invalid_request_error", code="unsupported_endpoint", model=model)
        missing = next((name for name in _REQUIRED.get(req.url, ()) if name not in body), None)
        if missing is not None:
            error = {"message": f"Missing required parameter: '{missing}'.", "type": "invalid_request_error",
                     "param": missing, "code": "missing_required_parameter"}
            return Result(line=req.line, custom_id=req.custom_id, status_code=400, body={"error": error}, model=model)
        try:
            reply = await call(model=model, **body)
        except Exception as exc:  # a provider error is this line's result, never the batch's end
            err = provider_error(exc, model)
            if err.body is None:
                return Result.failure(req.line, req.custom_id, str(err.code), str(err.message), model=model)
            return Result(line=req.line, custom_id=req.custom_id, status_code=err.status, body=err.body, model=model)
        if reply is None:
            # LiteLLM returns None when a provider keeps answering 422 after it dropped the
            # parameters it could (drop_params): the provider's reply is lost inside LiteLLM.
            return Result.failure(req.line, req.custom_id, UPSTREAM_ERROR,
                                  f"the upstream for model {model!r} rejected the request (no reply kept)", model=model)
        data = _to_body(reply, exclude_none=req.url in _SPARSE)
        cost = self._prices.cost(reply, data)
        return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=data, model=model, cost_usd=cost)

    def _method(self, endpoint: Endpoint) -> Callable[..., Awaitable[Any]] | None:
        name = _METHODS.get(endpoint)
        return getattr(self._router, name) if name is not None else None


# LiteLLM's types for these replies add every field they know as null (moderation
# categories, image options); the provider sent none of them.
_SPARSE = frozenset({Endpoint.MODERATIONS, Endpoint.IMAGES})


def _to_body(reply: Any, exclude_none: bool = False) -> dict[str, Any]:
    if isinstance(reply, dict):
        return reply
    dump = getattr(reply, "model_dump", None)
    data: dict[str, Any] = dump(exclude_none=exclude_none) if dump is not None else dict(reply)
    # LiteLLM's bookkeeping fields are not part of the provider's reply
    for key in ("_hidden_params", "_response_headers"):
        data.pop(key, None)
    return data
