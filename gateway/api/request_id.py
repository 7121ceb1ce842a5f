"""`x-request-id` on every response, and one log line per request that carries it.

OpenAI answers every request, errors included, with an `x-request-id` header
(its SDKs expose it as `_request_id`); a client quoting it should find the
matching server log line. A client's own `X-Client-Request-Id` is logged next
to ours but not echoed: OpenAI does not echo it either.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware) so a streamed file
stays streamed: it only adds a header to `http.response.start` and passes every
body message through untouched.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.http_errors import unexpected_error_response
from gateway.log_safe import escaped

log = logging.getLogger("batchyard.access")

HEADER = b"x-request-id"
_CLIENT_HEADER = b"x-client-request-id"
_CLIENT_ID_MAX = 512  # OpenAI caps X-Client-Request-Id at 512 ASCII characters


def new_request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status: list[int] = [0]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Starlette's outermost ServerErrorMiddleware would answer this 500 past us, without
            # the header; answer it here (the same body) and re-raise so the traceback is logged.
            if not status[0]:
                await unexpected_error_response()(scope, receive, send_with_id)
            raise
        finally:
            _log_request(scope, request_id, status[0], time.perf_counter() - started)


def _log_request(scope: Scope, request_id: str, status: int, seconds: float) -> None:
    client = _client_request_id(scope.get("headers", []))
    peer = scope.get("client")
    where = f"{peer[0]}:{peer[1]}" if peer else "-"
    query = scope.get("query_string", b"").decode("latin-1")
    # the query carries no secret (keys come in headers); it is kept to tell list pages apart. The path is
    # decoded (`%0a` is a line break): escaped, so a caller never writes a line of the log.
    target = escaped(scope.get("path", "") + (f"?{query}" if query else ""))
    extra = f" client_request_id={client}" if client else ""
    log.info('%s "%s %s" %d %.1fms request_id=%s%s', where, escaped(scope.get("method", "-")), target, status or 500,
             seconds * 1000, request_id, extra)


def _client_request_id(headers: Any) -> str | None:
    for key, value in headers:
        if key.lower() == _CLIENT_HEADER:
            # one log line, and one field of it: control characters escaped, spaces made `_`
            return escaped(value.decode("latin-1")[:_CLIENT_ID_MAX]).replace(" ", "_")
    return None
