"""Batches: create, list, get, cancel; and our extensions, a batch's results so far and a retry of its
lines without a 2xx reply (`gateway.finished.results`, `gateway.finished.retry_failed`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api import idempotency
from gateway.api.deps import Caller, bad_request, check_id, check_limit, list_reply, parse_body, runtime_of
from gateway.api.form import read_capped
from gateway.callers import idempotent_creates
from gateway.config.urls import normalise_endpoint
from gateway.domain import MESSAGE_BATCH_KIND, Endpoint
from gateway.errors import invalid_value, not_found, shown
from gateway.finished.results import Cursor, results_page
from gateway.finished.retry_failed import retry_batch
from gateway.json_codec import loads_checked
from gateway.pipeline.batch_params import CreateBatch

if TYPE_CHECKING:
    from gateway.api.auth import Principal
    from gateway.store.records import BatchRecord

router = APIRouter()

_MAX_BODY = 1024 * 1024
# Containers a create body may nest: its deepest parameter (metadata, output_expires_after) is two levels in;
# the slack is for keys OpenAI's API has that we ignore.
MAX_BODY_DEPTH = 32
_RESULTS_LIMIT, _MAX_RESULTS_LIMIT = 1000, 10_000  # lines per page of results: the page is what is held


@router.post("/batches")
async def create_batch(request: Request, caller: Caller) -> JSONResponse:
    data = await _json_object(request)
    # Llama Stack's clients send the key in the body: it is no parameter of the batch (nor of its fingerprint).
    claim = idempotency.claim_for(request, caller.owner, data.pop(idempotency.BODY_FIELD, None))
    body = parse_body(CreateBatch, data)
    if claim is None:
        return JSONResponse((await _create(request, caller, body)).to_openai())
    fingerprint = idempotent_creates.fingerprint("batch", data)
    first = await claim.take(idempotent_creates.BATCH_HOLD, fingerprint)
    if first is not None:
        return await idempotency.replay(claim, first, fingerprint,
                                        lambda batch_id: _current(request, caller, batch_id))
    try:
        rec = await _create(request, caller, body)
    except BaseException:
        await claim.drop()
        raise
    return await idempotency.made(claim, fingerprint, "batch", rec.id, rec.to_openai())


async def _create(request: Request, caller: Principal, body: CreateBatch) -> BatchRecord:
    if normalise_endpoint(body.endpoint) is Endpoint.MESSAGES:  # Anthropic's: its batches have their own API
        raise invalid_value(body.endpoint, [e.value for e in Endpoint if e is not Endpoint.MESSAGES], "endpoint")
    return await runtime_of(request).service.create_batch(
        caller.owner,
        input_file_id=check_id(body.input_file_id, "file", "input_file_id"),
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        metadata=body.metadata,
        output_expires_after=body.output_expires_after,
        allowed_models=caller.allowed_models,
    )


async def _current(request: Request, caller: Principal, batch_id: str) -> dict[str, Any] | None:
    rec = await runtime_of(request).store.batches.get(batch_id, caller.owner)
    return rec.to_openai() if rec is not None else None


@router.get("/batches")
async def list_batches(request: Request, caller: Caller, limit: int = 20, after: str | None = None) -> JSONResponse:
    page = await runtime_of(request).store.batches.page(caller.owner, limit=check_limit(limit, 100), after=after,
                                                        kind="batch")
    return JSONResponse(list_reply([b.to_openai() for b in page.data], page.has_more))


@router.get("/batches/{batch_id}")
async def get_batch(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    store = runtime_of(request).store
    rec = await store.batches.get(_batch_id(batch_id), caller.owner)
    if rec is None:
        raise not_found("batch", batch_id)
    live = None if rec.status.finished else await store.ledger.route_stats(rec.id)
    return JSONResponse(rec.to_openai(live))


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    rec = await runtime_of(request).service.cancel_batch(_batch_id(batch_id), caller.owner)
    return JSONResponse(rec.to_openai())


@router.get("/batches/{batch_id}/results")
async def batch_results(
    request: Request, caller: Caller, batch_id: str, after: str | None = None, limit: int = _RESULTS_LIMIT
) -> Response:
    """The results recorded so far, as JSONL, one page; `x-next-cursor` is the next page's `after`."""
    return await results_reply(request, caller, _batch_id(batch_id), after, limit)


async def results_reply(request: Request, caller: Principal, batch_id: str, after: str | None, limit: int) -> Response:
    """A batch's results so far, of either family (the dashboard shows Message Batches too)."""
    runtime = runtime_of(request)
    rec = await runtime.store.batches.get(batch_id, caller.owner)
    if rec is None:
        raise not_found("batch", batch_id)
    page = await results_page(runtime.store, runtime.blobs, rec, Cursor.parse(after),
                              check_limit(limit, _MAX_RESULTS_LIMIT), runtime.config.batch.max_results_page_bytes)
    headers = {"x-next-cursor": str(page.cursor), "x-has-more": "true" if page.has_more else "false",
               "x-batch-status": rec.status.value}
    return Response(b"".join(page.lines), media_type="application/jsonl", headers=headers)


@router.post("/batches/{batch_id}/retry")
async def retry(request: Request, caller: Caller, batch_id: str) -> JSONResponse:
    rec = await retry_batch(runtime_of(request).service, _batch_id(batch_id), caller.owner,
                            caller.allowed_models)
    return JSONResponse(rec.to_openai())


def _batch_id(batch_id: str) -> str:
    """An OpenAI batch's id; a Message Batch's (`msgbatch_…`) is unknown here, as any other family's would be."""
    if batch_id.startswith(MESSAGE_BATCH_KIND + "_"):
        raise not_found("batch", batch_id)
    return check_id(batch_id, "batch", "batch_id")


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await read_capped(request, _MAX_BODY)
    try:
        body = loads_checked(raw, MAX_BODY_DEPTH)
    except ValueError as exc:  # not strict JSON (NaN, a lone surrogate), or nested too deeply
        raise bad_request(f"The request body is not valid JSON ({shown(exc)}).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body
