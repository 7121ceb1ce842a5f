"""OpenAI's Uploads: one File of any size (up to `max_upload_bytes`) sent in parts of up to 64 MB.

An Upload is `pending` for an hour (`batch_settings.upload_expiry_seconds`) and takes parts; each part's bytes go
to the blob store as they arrive (`uploads/{upload_id}/{part_id}`) and count against the team's storage quota
from the first byte, under the part's own entry. `complete` checks the parts named (this Upload's, each once,
adding up to `bytes`, the `md5` if given, read as a stream) and makes the File: a manifest of the parts in order
(`gateway.store.blobs.composed`), so no byte is read into memory or written twice; on S3, parts big enough for
its multipart are joined inside S3 into one object (`Blobs.compose`). The File's id is fixed when the Upload is
created, so a `complete` cut short (a crash) is made whole by calling it again: the same manifest, the same
record. `cancel` and the sweep (at `expires_at`) remove the parts and their quota.

A kill inside `complete` leaves the Upload `pending` with no File (call `complete` again: it works), or with its
File recorded. The File's record is the point of no return: `complete` notes the parts it names on the Upload
before it composes them, and once the File is recorded whatever finds the Upload still `pending` (the next
`complete`, `cancel` or the sweep) marks it `completed` and removes the parts the File does not read, their
records and their quota (`_recover`), as the sweep does for a `completed` Upload with part records left. Writes a
kill left unfinished in the Upload's folder (S3's multipart uploads, temporary files) go with the folder at
expiry, or when the sweep forgets a finished Upload.

Records live in the store's `backend_state` (`upload:{id}`, and `upload:{id}:part:{part_id}` per part).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway import crash_points
from gateway.domain import new_id
from gateway.errors import Conflict, InvalidRequest, TooLarge, invalid_value, not_found, shown
from gateway.pipeline.batch_params import ExpiresAfter
from gateway.store.blobs import composed
from gateway.store.records import FileRecord, now, storage_team
from gateway.store.storage import StorageMeter

if TYPE_CHECKING:
    from gateway.pipeline.batch_service import BatchService

MAX_PART_BYTES = 64 * 1024 * 1024  # OpenAI's part limit
MAX_PARTS = 10_000  # 8 GB in parts of under 1 MB; bounds the parts one Upload keeps and one manifest lists
UPLOAD_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
_KEPT_SECONDS = 86_400  # a finished or expired Upload's record, kept past its expiry so late calls get its status
_JSONL = ("application/jsonl", "application/x-jsonl", "application/jsonlines", "application/x-jsonlines",
          "application/x-ndjson", "text/jsonl")
_IMAGES = ("image/gif", "image/jpeg", "image/jpg", "image/png", "image/webp")
# OpenAI's supported types for file search and code interpreter (its Assistants "supported files" tables)
_DOCUMENTS = ("application/json", "application/msword", "application/pdf", "application/typescript",
              "application/vnd.openxmlformats-officedocument.presentationml.presentation",
              "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
              "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "application/x-sh",
              "application/x-tar", "application/zip", "text/css", "text/csv", "text/html", "text/javascript",
              "text/markdown", "text/plain", "text/x-c", "text/x-c++", "text/x-csharp", "text/x-golang", "text/x-java",
              "text/x-php", "text/x-python", "text/x-ruby", "text/x-script.python", "text/x-tex", "text/xml")
# The MIME types each purpose takes (`user_data` any); a type's parameters (`; charset=utf-8`) and case aside
MIME_TYPES: dict[str, tuple[str, ...] | None] = {
    "batch": _JSONL, "fine-tune": _JSONL, "evals": _JSONL, "vision": _IMAGES,
    "assistants": tuple(sorted({*_DOCUMENTS, *_IMAGES})), "user_data": None}
_MIME_SHAPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
_PREFIX = "upload:"


def upload_folder(upload_id: str) -> str:
    """Every blob of one Upload: its parts, and once completed its File's manifest."""
    return f"uploads/{upload_id}"


def part_key(upload_id: str, part_id: str) -> str:
    return f"{upload_folder(upload_id)}/{part_id}"


def file_key(upload_id: str) -> str:
    """The completed File's bytes: one object of its parts (S3), or beside it the manifest of its parts, read as
    their concatenation (`Blobs.compose` says which)."""
    return f"{upload_folder(upload_id)}/file"


@dataclass(slots=True)
class UploadRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    mime_type: str
    created_at: int
    expires_at: int
    file_id: str  # the File `complete` makes (fixed up front: a second `complete` makes the same one)
    file_expiry_seconds: int | None = None  # after the File is made
    status: str = "pending"
    part_ids: list[str] | None = None  # the parts `complete` makes the File of, noted before it makes it

    def current_status(self, at: int) -> str:
        return "expired" if self.status == "pending" and at >= self.expires_at else self.status


@dataclass(slots=True)
class PartRecord:
    id: str
    upload_id: str
    bytes: int
    created_at: int

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "upload.part", "created_at": self.created_at, "upload_id": self.upload_id}


class Uploads:
    """The Uploads of every team, kept beside its files (`BatchService`'s store, blobs and storage quota)."""

    def __init__(self, service: BatchService) -> None:
        self.service = service
        self.state = service.store.backend_state
        self.blobs = service.blobs

    # -- records --------------------------------------------------------------------------------------

    async def get(self, upload_id: str, owner: str | None) -> UploadRecord:
        """The Upload, or 404 (another team's too)."""
        data = await self.state.get(_PREFIX + upload_id)
        if data is None or (owner is not None and data["owner"] != owner):
            raise not_found("upload", upload_id, "upload_id")
        return UploadRecord(**data)

    async def _save(self, rec: UploadRecord) -> None:
        await self.state.put(_PREFIX + rec.id, dataclasses.asdict(rec))

    async def parts(self, upload_id: str) -> dict[str, PartRecord]:
        found = await self.state.scan(f"{_PREFIX}{upload_id}:part:")
        return {p["id"]: PartRecord(**p) for p in found.values()}

    # -- the API's verbs ------------------------------------------------------------------------------

    async def create(self, owner: str, *, filename: str, purpose: str, size: int, mime_type: str,
                     expires_after: ExpiresAfter | None) -> UploadRecord:
        if purpose not in UPLOAD_PURPOSES:
            raise invalid_value(purpose, sorted(UPLOAD_PURPOSES), "purpose")
        check_mime_type(mime_type, purpose)
        limit = self.service.config.batch.max_upload_bytes
        if size > limit:
            raise InvalidRequest(f"Upload size {size} exceeds the maximum of {limit} bytes.", param="bytes",
                                 code="upload_too_large")
        if size < 0:
            raise InvalidRequest("'bytes' must be a non-negative integer.", param="bytes", code="invalid_value")
        created = now()
        # the File's expiry counts from the File's creation (at `complete`), as a plain upload's does
        file_expires = expires_after.seconds if expires_after else self.service.config.batch.file_expiry_seconds
        expires_at = created + self.service.config.batch.upload_expiry_seconds
        rec = UploadRecord(new_id("upload"), owner, filename, purpose, size, mime_type, created, expires_at,
                           new_id("file", sep="-"), file_expires)
        await self._save(rec)
        return rec

    async def add_part(self, upload_id: str, owner: str, chunks: AsyncIterable[bytes]) -> PartRecord:
        """Store one part as it streams: in the blob store, metered against the team's storage quota."""
        rec = await self.get(upload_id, owner)
        self._check_pending(rec)
        have = await self.parts(upload_id)
        if len(have) >= MAX_PARTS:
            raise InvalidRequest(f"Upload {upload_id} already has the maximum of {MAX_PARTS} parts.",
                                 param="data", code="too_many_parts")
        # Room for every part twice over: a part whose reply was lost (a retry, a client killed before it
        # noted the part id) is sent again, and the copy not named at `complete` is dropped then. Past that,
        # the parts could never make a File of `bytes`.
        room = 2 * rec.bytes - sum(p.bytes for p in have.values())
        part = PartRecord(new_id("part"), upload_id, 0, now())
        team = storage_team(owner)
        meter = StorageMeter(self.service.store.storage, team, part.id, self.service.storage_limit(team))
        try:
            async with self.blobs.writing(part_key(upload_id, part.id)) as writer:
                async for chunk in meter.metered(chunks):
                    part.bytes += len(chunk)
                    if part.bytes > MAX_PART_BYTES:
                        raise TooLarge(f"Part size exceeds the maximum of {MAX_PART_BYTES} bytes.", param="data",
                                       code="part_too_large")
                    if part.bytes > min(room, rec.bytes):
                        raise InvalidRequest(f"The parts of Upload {upload_id} would exceed its {rec.bytes} "
                                             "bytes.", param="data", code="upload_too_large")
                    await writer.write(chunk)
            # Bytes before their record: a record always has its bytes. A crash in between leaves bytes the sweep
            # removes with the Upload's folder, and a quota entry left pending, which the ledger drops once stale.
            await self.state.put(self._part_state(part), dataclasses.asdict(part))
        except BaseException:
            await self.service.store.storage.release(team, part.id)
            raise
        now_rec = await self.get(upload_id, owner)
        if now_rec.current_status(now()) != "pending":  # cancelled, completed or expired while it streamed
            await self._drop(part, team)
            self._check_pending(now_rec)
        return part

    async def complete(self, upload_id: str, owner: str, part_ids: list[str], md5: str | None) -> UploadRecord:
        rec = await self.get(upload_id, owner)
        if await self._recover(rec) and rec.part_ids == part_ids:
            return rec  # the answer a kill kept from the call that recorded the File
        if rec.status == "completed":
            raise Conflict(f"Upload {upload_id} has already been completed.", param="upload_id",
                           code="upload_already_completed")
        self._check_pending(rec)
        have = await self.parts(upload_id)
        if len(set(part_ids)) != len(part_ids):
            raise InvalidRequest("'part_ids' lists a part more than once.", param="part_ids", code="duplicate_part")
        order: list[tuple[str, int]] = []
        for i, part_id in enumerate(part_ids):
            part = have.get(part_id)
            if part is None:  # unknown, or a part of another Upload
                raise InvalidRequest(f"Part {part_id} is not a part of Upload {upload_id}.",
                                     param=f"part_ids[{i}]", code="invalid_part")
            order.append((part_key(upload_id, part_id), part.bytes))
        total = sum(size for _, size in order)
        if total != rec.bytes:
            raise InvalidRequest(f"The parts add up to {total} bytes, but the Upload was created with "
                                 f"bytes={rec.bytes}.", param="part_ids", code="bytes_mismatch")
        if md5 is not None:
            digest = hashlib.md5(usedforsecurity=False)
            for part_key_, _ in order:  # streamed part by part: never the whole file in memory
                async for chunk in self.blobs.read(part_key_):
                    digest.update(chunk)
            if digest.hexdigest() != md5.lower():
                raise InvalidRequest(f"The md5 checksum of the parts ({digest.hexdigest()}) does not match the "
                                     f"md5 given ({md5}).", param="md5", code="md5_mismatch")
        rec.part_ids = part_ids
        await self._save(rec)  # before the File: what `_recover` finishes if a kill follows its record
        key = await self.blobs.compose(file_key(upload_id), order)  # again after a kill: the same bytes
        crash_points.reached("uploads.complete.composed")
        created = now()
        expires_at = created + rec.file_expiry_seconds if rec.file_expiry_seconds is not None else None
        file = FileRecord(rec.file_id, owner, total, created, rec.filename, rec.purpose, expires_at, key)
        team = storage_team(owner)
        await self.service.store.storage.settle(team, file.id, total)  # the File counts before its parts go
        await self.service.store.files.put(file)
        crash_points.reached("uploads.complete.file_recorded")
        await self._finish(rec, file)
        self.service.file_stored(file)
        return rec

    async def _recover(self, rec: UploadRecord) -> bool:
        """Finish a `complete` a kill cut short after it recorded the File (True: this call did, and `rec` is now
        `completed`); for a `completed` Upload, remove the parts a kill left. A `pending` Upload without its File
        is left as it is: `complete` makes the File anew."""
        if rec.status == "completed":
            if await self.parts(rec.id):
                await self._finish(rec, await self.service.store.files.get(rec.file_id, rec.owner))
            return False
        if rec.status != "pending" or rec.part_ids is None:
            return False
        file = await self.service.store.files.get(rec.file_id, rec.owner)
        if file is None:
            return False
        await self._finish(rec, file)
        return True

    async def _finish(self, rec: UploadRecord, file: FileRecord | None) -> None:
        """The Upload `completed`, and each part gone but the bytes the File reads (its manifest's parts): the
        File counts them under its own entry. `file` None: the File was deleted since, and took its bytes."""
        if rec.status != "completed":
            rec.status = "completed"
            await self._save(rec)
        listed = file is not None and composed.is_composed(file.blob_key)  # the parts are the File's bytes
        kept = set(rec.part_ids or ()) if listed else set()
        if file is not None:  # a `complete` a kill cut short may have joined parts the other way (S3 does both)
            if listed:  # an object joined at the plain key, never the manifest that is the File's bytes
                await self.blobs.delete(file_key(rec.id), manifest=False)
            else:
                await self.blobs.delete(file_key(rec.id) + composed.SUFFIX)
        team = storage_team(rec.owner)
        for part in (await self.parts(rec.id)).values():
            if part.id not in kept:
                await self.blobs.delete(part_key(rec.id, part.id))
            await self.service.store.storage.release(team, part.id)
            await self.state.delete(self._part_state(part))
            crash_points.reached("uploads.complete.part_removed")

    async def cancel(self, upload_id: str, owner: str) -> UploadRecord:
        rec = await self.get(upload_id, owner)
        if rec.status == "cancelled":
            return rec
        await self._recover(rec)  # its File recorded: `completed`, and refused below
        self._check_pending(rec)
        rec.status = "cancelled"
        await self._save(rec)
        await self._drop_parts(rec)
        return rec

    async def file_of(self, rec: UploadRecord) -> FileRecord | None:
        return await self.service.store.files.get(rec.file_id, rec.owner) if rec.status == "completed" else None

    # -- the sweep ------------------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Expire the Uploads past their hour (their parts and quota go); forget old finished ones. Returns
        how many expired."""
        t, expired = now(), 0
        found = await self.state.scan(_PREFIX)
        with_parts = {data["upload_id"] for key, data in found.items() if ":part:" in key}
        for key, data in found.items():
            if ":part:" in key:
                continue
            rec = UploadRecord(**data)
            if (rec.id in with_parts or rec.part_ids is not None) and await self._recover(rec):
                continue  # a kill came between its File's record and the end of `complete`
            # an Upload whose `complete` began expires its own span later: never under a `complete` still running
            completing = rec.expires_at - rec.created_at if rec.part_ids is not None else 0
            if rec.status == "pending" and t >= rec.expires_at + completing:
                rec.status = "expired"
                await self._save(rec)
                await self._drop_parts(rec)
                expired += 1
            elif rec.status != "pending" and t >= rec.expires_at + _KEPT_SECONDS:
                await self.blobs.discard_unfinished(upload_folder(rec.id))  # long past any writer of it
                await self.state.delete(key)
        return expired

    async def _drop_parts(self, rec: UploadRecord) -> None:
        """Every part of an Upload that made no File (cancelled, expired), and bytes a crash left unrecorded."""
        team = storage_team(rec.owner)
        for part in (await self.parts(rec.id)).values():
            await self._drop(part, team)
        await self.blobs.delete_prefix(upload_folder(rec.id))
        await self.service.store.storage.release(team, rec.file_id)  # held by a `complete` killed before the File

    async def _drop(self, part: PartRecord, team: str) -> None:
        await self.blobs.delete(part_key(part.upload_id, part.id))
        await self.service.store.storage.release(team, part.id)
        await self.state.delete(self._part_state(part))

    @staticmethod
    def _part_state(part: PartRecord) -> str:
        return f"{_PREFIX}{part.upload_id}:part:{part.id}"

    def _check_pending(self, rec: UploadRecord) -> None:
        status = rec.current_status(now())
        if status != "pending":
            raise Conflict(f"Upload {rec.id} is {status}: it takes no more parts and cannot be completed.",
                           param="upload_id", code=f"upload_{status}")


def check_mime_type(mime_type: str, purpose: str) -> None:
    """OpenAI's rule: `mime_type` falls within the types `purpose` supports (`MIME_TYPES`). A bare subtype, as
    the `openai` SDK's own example writes it (`mime_type="pdf"`), stands for its type."""
    bare = mime_type.split(";", 1)[0].strip().lower()
    supported = MIME_TYPES[purpose]
    if supported is None:
        if not _MIME_SHAPE.fullmatch(bare if "/" in bare else f"application/{bare}"):
            raise InvalidRequest(f"Invalid value: '{shown(mime_type)}'. 'mime_type' must be a MIME type "
                                 "(type/subtype).", param="mime_type", code="invalid_value")
    elif bare not in supported and ("/" in bare or not any(t.split("/")[1] in (bare, f"x-{bare}")
                                                              for t in supported)):
        raise invalid_value(mime_type, list(supported), "mime_type")


__all__ = ["MAX_PARTS", "MAX_PART_BYTES", "MIME_TYPES", "UPLOAD_PURPOSES", "PartRecord", "UploadRecord", "Uploads",
           "check_mime_type", "file_key", "part_key", "upload_folder"]
