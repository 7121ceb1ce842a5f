"""Upstream providers in real time, through one LiteLLM `Router`.

The Router is built from every upstream entry of `model_list`: it does the
retries (with backoff, honouring Retry-After), rpm/tpm limits, cooldowns and
load balancing over several deployments of one `model_name`. This module only
maps a batch line to the Router call for its endpoint and the reply (or the
provider's error) back to a `Result`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway.backend import run_bounded
from gateway.records import BatchRequest, Endpoint, Result
from gateway.routes import Route

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map at import

log = logging.getLogger("batchyard.providers")

# Router settings that are ours to default; the config's router_settings win.
_ROUTER_DEFAULTS: dict[str, Any] = {"num_retries": 3, "timeout": 600, "retry_after": 0}


class LiteLLMBackend:
    """One backend for every upstream route: they share the Router and its limits."""

    endpoints = frozenset(
        {Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS, Endpoint.RESPONSES, Endpoint.RERANK}
    )

    def __init__(self, routes: Sequence[Route], router_settings: dict[str, Any], max_concurrency: int) -> None:
        self._model_list = [
            {k: v for k, v in entry.items() if k in ("model_name", "litellm_params", "model_info")}
            for route in routes
            for entry in route.deployments
        ]
        self._settings = {**_ROUTER_DEFAULTS, **router_settings}
        self._limit = asyncio.Semaphore(max_concurrency)
        self._router: Any = None

    async def start(self) -> None:
        if self._router is not None:
            return
        import litellm
        from litellm import Router

        litellm.suppress_debug_info = True
        litellm.drop_params = True  # a body field one provider lacks should not fail the line
        # Building a Router does seconds of synchronous work on first use: keep it off the event loop.
        self._router = await asyncio.to_thread(Router, model_list=self._model_list, **self._settings)

    async def aclose(self) -> None:
        self._router = None

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        await self.start()
        # aclosing: closing this iterator must close the inner one now, not at garbage collection
        async with contextlib.aclosing(run_bounded(requests, self._call, self._limit)) as results:
            async for result in results:
                yield result

    async def _call(self, req: BatchRequest) -> Result:
        body = dict(req.body)
        model = body.pop("model")
        try:
            call = self._method(req.url)
            reply = await call(model=model, **body)
            return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=_to_body(reply), model=model)
        except Exception as exc:  # a provider error is this line's result, never the batch's end
            status, err_body = _error_reply(exc)
            return Result(line=req.line, custom_id=req.custom_id, status_code=status, body=err_body, model=model)

    def _method(self, endpoint: Endpoint) -> Callable[..., Awaitable[Any]]:
        r = self._router
        table: dict[Endpoint, Callable[..., Awaitable[Any]]] = {
            Endpoint.CHAT: r.acompletion,
            Endpoint.COMPLETIONS: r.atext_completion,
            Endpoint.EMBEDDINGS: r.aembedding,
            Endpoint.RESPONSES: r.aresponses,
            Endpoint.RERANK: r.arerank,
        }
        if endpoint not in table:
            raise _Unsupported(f"{endpoint.value} is not supported for upstream models")
        return table[endpoint]


class _Unsupported(Exception):
    status_code = 400


def _to_body(reply: Any) -> dict[str, Any]:
    if isinstance(reply, dict):
        return reply
    dump = getattr(reply, "model_dump", None)
    data: dict[str, Any] = dump() if dump is not None else dict(reply)
    # LiteLLM's bookkeeping fields are not part of the provider's reply
    for key in ("_hidden_params", "_response_headers"):
        data.pop(key, None)
    return data


def _error_reply(exc: Exception) -> tuple[int, dict[str, Any]]:
    """The provider's status and error body, in OpenAI's shape."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or status < 400:
        status = 500
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and "error" in body:
        return status, body
    if isinstance(body, dict) and "message" in body:
        return status, {"error": body}
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    code = getattr(exc, "code", None)
    return status, {
        "error": {
            "message": str(message),
            "type": getattr(exc, "type", None) or type(exc).__name__,
            "param": getattr(exc, "param", None),
            "code": code if isinstance(code, str | int) else None,
        }
    }
