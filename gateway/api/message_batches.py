"""Anthropic's Message Batches API (`/v1/messages/batches`), as the anthropic SDK calls it.

A sub-application mounted at `/v1/messages`, so that every reply under it, auth failures and unknown
paths included, is in Anthropic's error shape (`{"type": "error", "error": {"type", "message"}}`), never
OpenAI's. A batch's `requests` become the pipeline's input lines (`/v1/messages` calls) in an input file
of its own, kept out of the team's files list as its results file is (`BatchRecord.files_owner`), and the
batch is created through the same intake as an OpenAI batch: same shards, workers, finalizer, quotas,
budgets, deadlines, dashboard and metrics. Its params are checked per request (the intake's non-strict
mode): a bad one is that request's `errored` result. The words (envelope, batch object, results) are
`gateway.message_batches`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.api.auth import Principal
from gateway.api.deps import Caller, runtime_of
from gateway.api.form import Body, declared_length
from gateway.api.http_errors import RETRY_AFTER_SECONDS, ApiError, ErrorDoor, install_error_handlers
from gateway.domain import MESSAGE_BATCH_KIND
from gateway.errors import Conflict, NotFound, OverQuota, TooLarge, shown
from gateway.finished.message_results import message_batch_results
from gateway.message_batches.outcomes import request_counts
from gateway.message_batches.wire import MAX_BODY_BYTES, EnvelopeError, anthropic_type, batch_object, error_body
from gateway.pipeline.message_batch_create import create_message_batch, delete_message_batch
from gateway.store.records import BatchRecord

log = logging.getLogger(__name__)

router = APIRouter()

_MAX_LIST = 1000  # Anthropic's bound on `limit`


def _not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"Message Batch '{shown(batch_id)}' not found.")


async def _batch(request: Request, caller: Principal, batch_id: str) -> BatchRecord:
    """The caller's Message Batch: an OpenAI batch's id, another team's or an unknown one is a 404."""
    if not batch_id.startswith(MESSAGE_BATCH_KIND + "_"):
        raise _not_found(batch_id)
    rec = await runtime_of(request).store.batches.get(batch_id, caller.owner)
    if rec is None:
        raise _not_found(batch_id)
    return rec


def _object(request: Request, rec: BatchRecord) -> dict[str, Any]:
    url = str(request.url.replace(path=f"/v1/messages/batches/{rec.id}/results", query=""))
    return batch_object(rec, request_counts(rec), url)


@router.post("/batches")
async def create(request: Request, caller: Caller) -> JSONResponse:
    """Bounded before it is parsed: the declared length, then the team's room, then the bytes as they stream,
    then each request's values and depth (`gateway.pipeline.message_batch_create`)."""
    runtime = runtime_of(request)
    limit = min(MAX_BODY_BYTES, runtime.config.batch.max_file_bytes)  # Anthropic's, or the operator's if lower
    # read in a validation process, off the API's loop and its GIL (in a thread where the runtime has none)
    reader = runtime.validation.read_create if runtime.validation is not None else None
    try:
        rec = await create_message_batch(runtime.service, caller.owner, Body(request.receive).chunks(),
                                         declared=declared_length(request.headers), limit=limit,
                                         allowed_models=caller.allowed_models, reader=reader)
    except EnvelopeError as exc:
        raise ApiError(400, str(exc)) from None
    except BrokenProcessPool:  # the reading process died twice (killed, out of memory): the machine's, not the body's
        log.warning("a validation process died twice while reading a Message Batch create; answered 529")
        # as for a fault of the machine: the SDK retries it
        return ANTHROPIC_DOOR.reply(529, "The server could not read the batch right now; the request was not "
                                    "completed. Try again later.", type_="overloaded_error",
                                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return JSONResponse(_object(request, rec))


@router.get("/batches")
async def list_batches(request: Request, caller: Caller, limit: int = 20, before_id: str | None = None,
                       after_id: str | None = None) -> JSONResponse:
    if not 1 <= limit <= _MAX_LIST:
        raise ApiError(400, f"limit: Input should be between 1 and {_MAX_LIST}")
    if before_id and after_id:
        raise ApiError(400, "Only one of before_id and after_id may be given.")
    page = await runtime_of(request).store.batches.page(caller.owner, limit=limit, after=after_id, before=before_id,
                                                        kind=MESSAGE_BATCH_KIND)
    data = [_object(request, rec) for rec in page.data]
    return JSONResponse({"data": data, "has_more": page.has_more,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})


@router.get("/batches/{batch_id}")
async def retrieve(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    return JSONResponse(_object(request, await _batch(request, caller, batch_id)))


@router.post("/batches/{batch_id}/cancel")
async def cancel(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    rec = await _batch(request, caller, batch_id)
    if not rec.status.finished:
        rec = await runtime_of(request).service.cancel_batch(rec.id, caller.owner)
    return JSONResponse(_object(request, rec))  # an ended batch stays as it ended, as Anthropic's


@router.delete("/batches/{batch_id}")
async def delete(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    rec = await _batch(request, caller, batch_id)
    if not rec.status.finished:
        raise ApiError(400, f"Message Batch '{rec.id}' is still being processed and cannot be deleted; "
                                  "cancel it first, and delete it once it has ended.")
    if not await delete_message_batch(runtime_of(request).service, rec):
        raise _not_found(batch_id)
    return JSONResponse({"id": rec.id, "type": "message_batch_deleted"})


@router.get("/batches/{batch_id}/results")
async def results(request: Request, caller: Caller, batch_id: str) -> Response:
    """The results as JSONL, one line per request in input order, streamed (one chunk read held at a time)."""
    rec = await _batch(request, caller, batch_id)
    if not rec.status.finished:
        raise ApiError(400, f"Message Batch '{rec.id}' has not ended yet; its results are available once "
                                  "its processing_status is 'ended'.")
    runtime = runtime_of(request)
    return StreamingResponse(await message_batch_results(runtime.store, runtime.blobs, rec),
                             media_type="application/binary")


# -- errors, in Anthropic's shape ---------------------------------------------------------------------------

class AnthropicDoor(ErrorDoor):
    """Anthropic's words for the one handler set: its shape, its type for a status (`wire.ERROR_TYPES`), the
    529 `overloaded_error` its SDK retries for a fault of the machine."""

    statuses = ((NotFound, 404), (TooLarge, 413), (OverQuota, 429), (Conflict, 400))
    fault_status = 529
    fault_type = "overloaded_error"
    unexpected = "Internal server error"

    def reply(self, status: int, message: str, *, type_: str | None = None, code: str | None = None,
              param: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
        # a type another family's words gave (OpenAI's `server_error`) reads as the status's Anthropic one
        return JSONResponse(error_body(anthropic_type(status, type_), message), status_code=status,
                            headers=dict(headers) if headers else None)

    def unknown_url(self, request: Request) -> str:
        return f"Not found: {request.method} {request.url.path}"

    def invalid(self, exc: RequestValidationError) -> JSONResponse:
        first: dict[str, Any] = next(iter(exc.errors()), {})
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return self.reply(400, f"{where}: {first.get('msg', 'invalid')}")


ANTHROPIC_DOOR = AnthropicDoor()


def message_batches_app(parent: FastAPI) -> FastAPI:
    """The sub-application to mount at `/v1/messages`: the parent's runtime and keys, Anthropic's errors."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = parent.state.runtime
    app.state.auth = parent.state.auth
    app.include_router(router)
    install_error_handlers(app, ANTHROPIC_DOOR)
    return app


__all__ = ["message_batches_app"]
