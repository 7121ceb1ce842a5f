"""Every failure answers in its door's error shape: OpenAI's `{"error": {message, type, param, code}}` here,
Anthropic's under `/v1/messages` (`gateway.api.message_batches`).

One handler set (`install_error_handlers`) classifies each failure once (status, type, message, code) and
hands it to the door (`ErrorDoor`), which renders it through its own table and words. No HTML page, no
FastAPI `{"detail": ...}`, no traceback in a reply.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from gateway import metrics
from gateway.errors import Conflict, GatewayError, InvalidRequest, NotFound, OverQuota, TooLarge, shown
from gateway.log_safe import escaped
from gateway.store.faults import CarriedFault, MachineFault, machine_fault, once_a_minute

log = logging.getLogger("batchyard.api")
# What a fault of the machine raises (`gateway.store.faults`): these get a look before the catch-all 500.
MACHINE_FAULT_ERRORS: tuple[type[Exception], ...] = (OSError, sqlite3.Error, RedisError, ClientError, BotoCoreError,
                                                CarriedFault)
RETRY_AFTER_SECONDS = 10


class ApiError(Exception):
    """An HTTP error reply the server itself decides on (auth, request framing): {"error": {...}}."""

    def __init__(
        self, status: int, message: str, *, type_: str | None = None, code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param


# OpenAI's error types by HTTP status: the one table of OpenAI's door. Another 5xx is a server_error,
# another 4xx an invalid_request_error.
_TYPES = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}
_CODES = {404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}
_MORE_ERRORS = 5  # a body's further validation errors named after the first (a reply stays small)


def _type_for(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_response(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_ or _type_for(status), "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


class ErrorDoor:
    """One API family's error replies: OpenAI's (this class), Anthropic's (`gateway.api.message_batches`).

    The handlers decide what failed and its status; a door says it in its own shape and words. A subclass
    overrides what its family says differently."""

    # the core's refusals, by kind (the first that matches)
    statuses: tuple[tuple[type[GatewayError], int], ...] = (
        (InvalidRequest, 400), (NotFound, 404), (Conflict, 409), (TooLarge, 413), (OverQuota, 429))
    fault_status = 503  # a fault of the machine: the status its family's SDK retries, and the type it reads
    fault_type: str | None = None
    unexpected = "The server had an error while processing your request."

    def reply(self, status: int, message: str, *, type_: str | None = None, code: str | None = None,
              param: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return error_response(status, message, type_=type_, code=code, param=param, headers=headers)

    def unknown_url(self, request: Request) -> str:
        return f"Unknown request URL: {request.method} {request.url.path}. Please check the URL for typos."

    def invalid(self, exc: RequestValidationError) -> JSONResponse:
        """A malformed query or body parameter: OpenAI answers 400 with its phrasing, never FastAPI's 422."""
        return _openai_invalid(exc)


OPENAI_DOOR = ErrorDoor()


def _openai_invalid(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if not errors:
        return error_response(400, "Invalid request.", code="invalid_request")
    first = errors[0]
    param = _param(tuple(first.get("loc", ())))
    code = _code(str(first.get("type", "")))
    # OpenAI's phrasing: "Missing required parameter: 'x'." / "Invalid type for 'x': …" / "Invalid value for 'x': …"
    if code == "missing_required_parameter":
        message = f"Missing required parameter: '{param}'."
    else:
        kind = "type" if code == "invalid_type" else "value"
        message = f"Invalid {kind} for '{param or 'request'}': {first.get('msg', 'invalid')}."
    if len(errors) > 1:
        message += " Also: " + "; ".join(
            f"{_param(tuple(e.get('loc', ()))) or 'request'}: {e.get('msg', 'invalid')}"
            for e in errors[1:1 + _MORE_ERRORS])
        if len(errors) > 1 + _MORE_ERRORS:
            message += f"; and {len(errors) - 1 - _MORE_ERRORS} more."
    return error_response(400, message, code=code, param=param)


def unexpected_error_response() -> JSONResponse:
    return error_response(500, ErrorDoor.unexpected, code="internal_error")


def allowed_methods(request: Request) -> str:
    """Every method a route of the app serves on the request's path (`GET, POST`)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        served = getattr(route, "methods", None)
        if served and route.matches(request.scope)[0] is not Match.NONE:
            methods |= served
    return ", ".join(sorted(methods))


def _param(loc: tuple[Any, ...]) -> str | None:
    # loc is ("query", "limit") or ("body", "metadata", "k"): drop where it came from
    # a caller's key (metadata's) is part of the loc: cut to a prefix, as any value shown back
    parts = [shown(p) for p in loc[1:]] if len(loc) > 1 else [shown(p) for p in loc]
    if "[key]" in parts:  # a mapping's key is wrong (metadata's): name the mapping, not the key's text
        parts = parts[:max(parts.index("[key]") - 1, 0)]
    return ".".join(parts) or None


def _code(kind: str) -> str:
    # pydantic's error kinds ("missing", "int_parsing", "string_type", "greater_than", …) in OpenAI's words
    if kind == "missing":
        return "missing_required_parameter"
    if kind.endswith(("_parsing", "_type")):
        return "invalid_type"
    return "invalid_value"


def observed_fault(request: Request, exc: Exception, status: int) -> MachineFault | None:
    """The fault of the machine behind a request's storage error (a full disk, the store or S3 down), counted and
    logged at most once a minute, without a traceback; None for any other error of these types, a bug, logged
    with its traceback. Each API family answers it in its own shape, with `status`."""
    fault = machine_fault(exc)
    if fault is None:
        log.error("%s %s failed", escaped(request.method), escaped(request.url.path), exc_info=exc)
        return None
    metrics.observe_machine_fault(fault.kind)
    if once_a_minute(f"api:{fault.kind}"):
        log.warning("%s unavailable (%s: %s); answering %d to %s %s", fault.service, fault.words,
                    escaped(fault.detail), status, escaped(request.method), escaped(request.url.path))
    return fault


def install_error_handlers(app: FastAPI, door: ErrorDoor = OPENAI_DOOR) -> None:
    """The one handler set, each failure classified once and said by `door`."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return door.reply(exc.status, exc.message, type_=exc.type, code=exc.code, param=exc.param)

    async def gateway_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GatewayError)
        status = next((code for kind, code in door.statuses if isinstance(exc, kind)), 400)
        # OpenAI's quota refusal is its own type: {"type": "insufficient_quota", "code": "insufficient_quota"}
        type_ = exc.code if exc.code == "insufficient_quota" else None
        return door.reply(status, exc.message, type_=type_, code=exc.code, param=exc.param)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return door.reply(404, door.unknown_url(request), code=_CODES[404], headers=exc.headers)
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route that matched the path; a path may have
            # several (GET and POST /v1/batches are two routes): every method served there (RFC 9110).
            return door.reply(405, f"Method {request.method} is not allowed on {request.url.path}.",
                              code=_CODES[405], headers={**(exc.headers or {}), "Allow": allowed_methods(request)})
        return door.reply(exc.status_code, str(exc.detail), code=_CODES.get(exc.status_code), headers=exc.headers)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return door.invalid(exc)

    async def machine_fault(request: Request, exc: Exception) -> JSONResponse:
        """A full disk, the store or S3 down: the status the family's SDK retries. Any other error of these
        types is a bug: 500."""
        if (fault := observed_fault(request, exc, door.fault_status)) is None:
            return door.reply(500, door.unexpected, code="internal_error")
        # `storage_unavailable`: the code callers already match on, kept whatever the fault's service
        return door.reply(door.fault_status, f"The server's {fault.service} is unavailable right now "
                          f"({fault.words}); the request was not completed. Try again later.",
                          type_=door.fault_type, code="storage_unavailable",
                          headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    async def client_disconnect(_: Request, __: Exception) -> JSONResponse:
        # Nobody reads this reply; it keeps the disconnect out of the error log.
        return door.reply(499, "Client closed the request.", code="client_closed_request")

    async def unexpected(_: Request, __: Exception) -> JSONResponse:
        # Starlette re-raises after this reply is sent, so the server logs the traceback; the caller never sees it.
        return door.reply(500, door.unexpected, code="internal_error")

    for kind in MACHINE_FAULT_ERRORS:
        app.add_exception_handler(kind, machine_fault)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(ClientDisconnect, client_disconnect)
    app.add_exception_handler(Exception, unexpected)
