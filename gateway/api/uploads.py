"""OpenAI's Uploads API: create, add a part (streamed), complete, cancel (`gateway.pipeline.uploads`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictInt, StrictStr

from gateway.api.deps import Caller, bad_request, check_id, parse_body, runtime_of
from gateway.api.files import file_object, unknown_parameters
from gateway.api.form import Body, Event, FileData, FileEnd, FileStart, FormReader, read_capped
from gateway.api.form import Field as FormField
from gateway.api.http_errors import ApiError
from gateway.errors import GatewayError, shown
from gateway.json_codec import loads_checked
from gateway.pipeline.batch_params import ExpiresAfter, Required
from gateway.pipeline.uploads import MAX_PART_BYTES, MAX_PARTS, UploadRecord, Uploads
from gateway.store.records import now

router = APIRouter()

_MAX_BODY = 1024 * 1024  # a create's or a complete's JSON (10,000 part ids fit)
_MAX_DEPTH = 8
_FORM_OVERHEAD = 64 * 1024
_DRAIN_LIMIT = 64 * 1024 * 1024


class CreateUpload(BaseModel):
    """OpenAI's CreateUploadRequest."""

    bytes: StrictInt
    filename: Required
    mime_type: Required
    purpose: Required
    expires_after: ExpiresAfter | None = None


class CompleteUpload(BaseModel):
    """OpenAI's CompleteUploadRequest: the parts in the File's order, and its md5 to check."""

    part_ids: Annotated[list[StrictStr], Field(max_length=MAX_PARTS)]
    md5: StrictStr | None = None


@router.post("/uploads")
async def create_upload(request: Request, caller: Caller) -> JSONResponse:
    body = parse_body(CreateUpload, await _json_object(request, CreateUpload))
    rec = await _uploads(request).create(caller.owner, filename=body.filename, purpose=body.purpose,
                                         size=body.bytes, mime_type=body.mime_type, expires_after=body.expires_after)
    return JSONResponse(await _upload_object(request, rec))


@router.post("/uploads/{upload_id}/parts")
async def add_part(request: Request, caller: Caller, upload_id: str) -> JSONResponse:
    uploads = _uploads(request)
    body = Body(request.receive)
    try:
        check_id(upload_id, "upload_", "upload_id")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_PART_BYTES + _FORM_OVERHEAD:
            raise ApiError(413, f"Part size exceeds the maximum of {MAX_PART_BYTES} bytes.", code="part_too_large",
                           param="data")
        await uploads.get(upload_id, caller.owner)  # 404 before a byte is stored
        reader = FormReader(request.headers.get("content-type", ""), body, max_parts=8)
        async with aclosing(reader.events()) as events:
            part = None
            async for event in events:
                if isinstance(event, FormField | FileStart) and event.name != "data":
                    raise unknown_parameters([shown(event.name)])
                if isinstance(event, FormField):  # `data` sent as a plain field: the bytes are its value
                    part = part or await uploads.add_part(upload_id, caller.owner, _one(event.value.encode()))
                elif isinstance(event, FileStart) and part is None:
                    part = await uploads.add_part(upload_id, caller.owner, _file_chunks(events))
        if part is None:
            raise bad_request("Missing required parameter: 'data'.", param="data", code="missing_required_parameter")
    except (ApiError, GatewayError):
        await body.drain(_DRAIN_LIMIT)  # the client reads our answer, not a connection reset
        raise
    return JSONResponse(part.to_openai())


@router.post("/uploads/{upload_id}/complete")
async def complete_upload(request: Request, caller: Caller, upload_id: str) -> JSONResponse:
    check_id(upload_id, "upload_", "upload_id")
    body = parse_body(CompleteUpload, await _json_object(request, CompleteUpload))
    rec = await _uploads(request).complete(upload_id, caller.owner, body.part_ids, body.md5)
    return JSONResponse(await _upload_object(request, rec))


@router.post("/uploads/{upload_id}/cancel")
async def cancel_upload(request: Request, caller: Caller, upload_id: str) -> JSONResponse:
    check_id(upload_id, "upload_", "upload_id")
    rec = await _uploads(request).cancel(upload_id, caller.owner)
    return JSONResponse(await _upload_object(request, rec))


def _uploads(request: Request) -> Uploads:
    return Uploads(runtime_of(request).service)


async def _upload_object(request: Request, rec: UploadRecord) -> dict[str, Any]:
    """OpenAI's Upload object; `file` is the File once completed, else null."""
    file = await _uploads(request).file_of(rec)
    return {"id": rec.id, "object": "upload", "bytes": rec.bytes, "created_at": rec.created_at,
            "filename": rec.filename, "purpose": rec.purpose, "status": rec.current_status(now()),
            "expires_at": rec.expires_at, "file": file_object(file) if file is not None else None}


async def _json_object(request: Request, model: type[BaseModel]) -> dict[str, Any]:
    raw = await read_capped(request, _MAX_BODY)
    try:
        body = loads_checked(raw, _MAX_DEPTH) if raw.strip() else {}
    except ValueError as exc:  # not strict JSON, or nested too deeply
        raise bad_request(f"The request body is not valid JSON ({shown(exc)}).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    extra = [shown(key) for key in body if key not in model.model_fields]
    if extra:
        raise unknown_parameters(extra)
    return body


async def _file_chunks(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    async for event in events:
        if isinstance(event, FileEnd):
            return
        if isinstance(event, FileData):
            yield event.data


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data
