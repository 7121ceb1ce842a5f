"""Files: upload (streamed), list, get, delete, content."""

from __future__ import annotations

import hashlib
import tempfile
import unicodedata
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.api import idempotency
from gateway.api.deps import Caller, bad_request, check_id, check_limit, list_reply, parse_body, runtime_of
from gateway.api.form import Body, Event, Field, FileData, FileEnd, FileStart, FormReader
from gateway.api.http_errors import ApiError
from gateway.callers import idempotent_creates
from gateway.errors import GatewayError, not_found, shown
from gateway.json_codec import loads_checked
from gateway.pipeline.batch_params import ExpiresAfter
from gateway.store.faults import machine_fault
from gateway.store.records import FileRecord
from gateway.store.splitter import prepended

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime
    from gateway.store.idempotency import IdempotencyEntry

router = APIRouter()

_DRAIN_LIMIT = 64 * 1024 * 1024  # unread upload bytes we still read (and drop) so the client sees our error
_FORM_OVERHEAD = 64 * 1024  # boundaries and small fields around the file in a multipart body
_SPOOL_IN_MEMORY = 1024 * 1024
_CHUNK = 1 << 16
MAX_FIELD_DEPTH = 8  # containers a JSON form field (`expires_after`, one flat object) may nest
# The form fields of OpenAI's CreateFileRequest (`additionalProperties: false`), `expires_after` also in the
# SDK's bracketed form. Beside them only `custom_llm_provider`: the field LiteLLM's docs have its proxy's
# clients send (a routing hint; here each line routes by its model). Any other field is refused, naming it.
_EXPIRY_KEYS = ("anchor", "seconds")
_NAMED = 5  # unknown parameters named in one reply (a form may have 64 parts)
FORM_FIELDS = frozenset({"file", "purpose", "expires_after", *(f"expires_after[{k}]" for k in _EXPIRY_KEYS),
                         "custom_llm_provider"})


@router.post("/files")
async def create_file(request: Request, caller: Caller) -> JSONResponse:
    runtime = runtime_of(request)
    body = Body(request.receive)
    claim: idempotent_creates.Claim | None = None
    first: IdempotencyEntry | None = None  # the entry of the first request with the key: this one replays it
    ours = False  # the key is reserved for this request: it goes if the upload fails
    try:
        _check_declared_size(request, runtime.config.batch.limits.max_file_bytes)
        claim = idempotency.claim_for(request, caller.owner)
        if claim is not None:
            # before a byte is stored; the fingerprint comes last
            first = await claim.take(idempotent_creates.FILE_HOLD)
            ours = first is None
        reader = FormReader(request.headers.get("content-type", ""), body)
        # A replay's bytes are read for their fingerprint only: nothing is stored twice.
        upload = _Upload(runtime, caller.owner, hashing=claim is not None) if first is None else \
            _Probe(runtime, caller.owner)
        async with aclosing(reader.events()) as events:
            rec = await upload.run(events)
    except BaseException as exc:
        if ours and claim is not None:
            await claim.drop()
        if isinstance(exc, ApiError | GatewayError) or (isinstance(exc, Exception) and machine_fault(exc)):
            await body.drain(_DRAIN_LIMIT)  # the client reads our answer, not a connection reset
        raise
    if claim is None:
        return JSONResponse(file_object(rec))
    if first is not None:
        return await idempotency.replay(claim, first, upload.fingerprint(),
                                        lambda file_id: _current(runtime, caller.owner, file_id))
    return await idempotency.made(claim, upload.fingerprint(), "file", rec.id, file_object(rec))


async def _current(runtime: Runtime, owner: str, file_id: str) -> dict[str, Any] | None:
    rec = await runtime.store.files.get(file_id, owner)
    return file_object(rec) if rec is not None else None


@router.get("/files")
async def list_files(
    request: Request,
    caller: Caller,
    purpose: str | None = None,
    limit: int = 10_000,
    order: str = "desc",
    after: str | None = None,
) -> JSONResponse:
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'.", param="order")
    page = await runtime_of(request).store.files.page(
        caller.owner, purpose=purpose, limit=check_limit(limit, 10_000), order=order, after=after
    )
    return JSONResponse(list_reply([file_object(f) for f in page.data], page.has_more))


@router.get("/files/{file_id}")
async def get_file(request: Request, caller: Caller, file_id: str) -> JSONResponse:
    return JSONResponse(file_object(await _owned(request, caller.owner, file_id)))


@router.delete("/files/{file_id}")
async def delete_file(request: Request, caller: Caller, file_id: str) -> JSONResponse:
    if not await runtime_of(request).service.delete_file(check_id(file_id, "file", "file_id"), caller.owner):
        raise not_found("file", file_id, "id")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get("/files/{file_id}/content")
async def file_content(request: Request, caller: Caller, file_id: str) -> StreamingResponse:
    rec = await _owned(request, caller.owner, file_id)
    chunks = runtime_of(request).service.open_file(rec)
    # The first chunk is read here, so a missing blob is an error reply and not a broken stream.
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = b""
    headers = {
        "Content-Disposition": f'attachment; filename="{_header_safe(rec.filename)}"',
        "Content-Length": str(rec.bytes),
    }
    return StreamingResponse(prepended(first, chunks), media_type="application/octet-stream", headers=headers)


def file_object(rec: FileRecord) -> dict[str, Any]:
    """OpenAI's File object. A file that never expires has no `expires_at`, and `status_details` is
    left out unless set (the schema types both as non-null; the SDK's FileObject reads a missing one
    as None)."""
    data = rec.to_openai()
    for name in ("expires_at", "status_details"):
        if data.get(name) is None:
            data.pop(name, None)
    return data


def _check_declared_size(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + _FORM_OVERHEAD:
        raise _too_large(limit)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The file is larger than the {limit} bytes allowed.", code="file_too_large", param="file")


async def _owned(request: Request, owner: str, file_id: str) -> FileRecord:
    rec = await runtime_of(request).store.files.get(check_id(file_id, "file", "file_id"), owner)
    if rec is None:
        raise not_found("file", file_id, "id")
    return rec


def _header_safe(name: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' and ord(c) < 128 else "_" for c in name)


def _filename(raw: str) -> str:
    name = PurePosixPath(raw.replace("\\", "/")).name
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    return name[:255] or "file"


def _purpose(fields: dict[str, str]) -> str:
    purpose = fields.get("purpose", "").strip()
    if not purpose:
        raise bad_request("Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter")
    return purpose  # the service checks its value


def unknown_parameters(names: list[str]) -> ApiError:
    """OpenAI's reply to a parameter it does not have: 400 `unknown_parameter`, `param` the first one."""
    quoted = ", ".join(f"'{name}'" for name in names[:_NAMED])
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return bad_request(f"Unknown parameter{'s' if len(names) > 1 else ''}: {quoted}{more}.", param=names[0],
                       code="unknown_parameter")


def _expires_after(fields: dict[str, str]) -> ExpiresAfter | None:
    """The SDK's bracketed form fields, or one `expires_after` field holding a JSON object (what
    generic multipart encoders, schemathesis's among them, send for an object)."""
    if "expires_after" in fields:
        try:
            value = loads_checked(fields["expires_after"].encode(), MAX_FIELD_DEPTH)
        except ValueError:  # not JSON, or nested too deeply
            value = None
        if not isinstance(value, dict):
            raise bad_request("expires_after must be an object with 'anchor' and 'seconds'.",
                              param="expires_after", code="invalid_type")
        extra = [f"expires_after.{shown(key)}" for key in value if key not in _EXPIRY_KEYS]
        if extra:
            raise unknown_parameters(extra)
        seconds = value.get("seconds")
        if seconds is not None and type(seconds) is not int:
            # JSON has integers: "7200" or 7200.0 here is the wrong type (only a form field's text is parsed)
            raise bad_request(f"Invalid type for 'expires_after.seconds': expected an integer, but got "
                              f"{type(seconds).__name__} instead.", param="expires_after.seconds", code="invalid_type")
        return parse_body(ExpiresAfter, value, "expires_after")
    given = {name: fields[key] for name in ("anchor", "seconds") if (key := f"expires_after[{name}]") in fields}
    return parse_body(ExpiresAfter, given, "expires_after") if given else None


class _Upload:
    """One upload: the fields in any order, the `file` part streamed to the service.

    When `purpose` comes before the file (as the OpenAI SDK and LiteLLM send it)
    the file's bytes go straight to the service as they arrive. Otherwise they
    are spooled (memory, then a temporary file) until the fields are known.
    """

    def __init__(self, runtime: Runtime, owner: str, *, hashing: bool = False) -> None:
        self.runtime, self.owner = runtime, owner
        self.limit = runtime.config.batch.limits.max_file_bytes
        self.fields: dict[str, str] = {}
        self.late: dict[str, str] = {}  # fields after a file already stored
        self.filename = ""
        self.digest = hashlib.sha256() if hashing else None  # of the file's bytes, for `fingerprint`

    async def run(self, events: AsyncIterator[Event]) -> FileRecord:
        rec: FileRecord | None = None
        spool: tuple[str, Any] | None = None
        unknown: list[str] = []  # fields CreateFileRequest does not name
        async for event in events:
            if isinstance(event, Field | FileStart) and event.name not in FORM_FIELDS:
                unknown.append(shown(event.name))  # a file part's bytes are skipped with the events below
            elif isinstance(event, Field):
                (self.late if rec is not None else self.fields).setdefault(event.name, event.value)
            elif isinstance(event, FileStart) and event.name == "file" and rec is None and spool is None:
                if unknown:  # named before the file: refused before a byte is stored
                    raise unknown_parameters(unknown)
                chunks = self._file_chunks(events)
                self.filename = _filename(event.filename)
                if "purpose" in self.fields:
                    rec = await self._store(self.filename, chunks)
                else:
                    spool = (self.filename, await self._spool(chunks))
            # a second `file` part: its FileStart/FileData/FileEnd events are skipped
        if unknown:  # named after the file: what was kept of it goes
            if spool is not None:
                spool[1].close()
            if rec is not None:
                await self._discard(rec)
            raise unknown_parameters(unknown)
        if spool is not None:
            filename, file = spool
            with file:
                return await self._store(filename, _read_spool(file))
        if rec is None:
            raise bad_request("Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
        return await self._apply_late_expiry(rec)

    async def _store(self, filename: str, chunks: AsyncIterator[bytes]) -> FileRecord:
        purpose, expiry = _purpose(self.fields), _expires_after(self.fields)
        return await self.runtime.service.upload_file(self.owner, filename, purpose, chunks, expires_after=expiry)

    async def _discard(self, rec: FileRecord) -> None:
        await self.runtime.service.delete_file(rec.id, self.owner)

    def fingerprint(self) -> str:
        """The upload as `Idempotency-Key` compares it (after `run`, with `hashing`): its purpose, filename,
        the expiry that applies (a late one wins, as in `_apply_late_expiry`) and its bytes' sha256."""
        given = self.late if _names_expiry(self.late) else self.fields
        expiry = _expires_after(given)
        return idempotent_creates.fingerprint("file", {
            "purpose": self.fields.get("purpose", "").strip(), "filename": self.filename,
            "expires_after": expiry.model_dump() if expiry else None,
            "sha256": self.digest.hexdigest() if self.digest else ""})

    async def _file_chunks(self, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        size = 0
        async for event in events:
            if isinstance(event, FileEnd):
                return
            if isinstance(event, FileData):
                size += len(event.data)
                if size > self.limit:
                    raise _too_large(self.limit)
                if self.digest is not None:
                    self.digest.update(event.data)
                yield event.data

    async def _spool(self, chunks: AsyncIterator[bytes]) -> Any:
        file = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 (closed by run())
        try:
            async for chunk in chunks:
                file.write(chunk)
        except BaseException:
            file.close()
            raise
        file.seek(0)
        return file

    async def _apply_late_expiry(self, rec: FileRecord) -> FileRecord:
        if not _names_expiry(self.late):
            return rec
        try:
            expiry = _expires_after(self.late)
        except (ApiError, GatewayError, RequestValidationError):
            await self.runtime.service.delete_file(rec.id, self.owner)
            raise
        if expiry is None:
            return rec
        return await self.runtime.service.set_file_expiry(rec, expiry)


class _Probe(_Upload):
    """A replayed upload (its key already made a file): read, checked and hashed as an upload is, for its
    fingerprint, and never stored."""

    def __init__(self, runtime: Runtime, owner: str) -> None:
        super().__init__(runtime, owner, hashing=True)

    async def _store(self, filename: str, chunks: AsyncIterator[bytes]) -> FileRecord:
        purpose, _ = _purpose(self.fields), _expires_after(self.fields)
        size = 0
        async for chunk in chunks:
            size += len(chunk)
        return FileRecord("", self.owner, size, 0, filename, purpose)  # stands for the file, never kept

    async def _discard(self, rec: FileRecord) -> None:
        pass

    async def _apply_late_expiry(self, rec: FileRecord) -> FileRecord:
        if _names_expiry(self.late):
            _expires_after(self.late)
        return rec


def _names_expiry(fields: dict[str, str]) -> bool:
    return any(k.startswith("expires_after") for k in fields)


async def _read_spool(file: Any) -> AsyncIterator[bytes]:
    while chunk := file.read(_CHUNK):
        yield chunk
