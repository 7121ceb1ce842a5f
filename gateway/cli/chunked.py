"""`batchyard submit`'s upload of a big file: OpenAI's Uploads API, part by part, resumable.

A file over `CHUNKED_OVER` (OpenAI's 200 MB for a file sent whole), or any file with `--chunked`, goes as an
Upload (`POST /uploads`, its parts, `complete` with the file's md5) through the `openai` SDK's own calls.
After each part the state file beside the output (`upload_state_path`) records the Upload and the parts sent,
so a rerun after a kill, a dropped connection or a refusal (a quota crossed) sends only the missing parts.
A rerun whose Upload is gone (expired after its hour, cancelled, unknown) starts a new one. A `complete` whose
reply was lost is found again among the team's files (the same name and size, made after the Upload).
Memory: one part.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai import OpenAI

from gateway.cli.console import say

CHUNKED_OVER = 200 * 1024 * 1024  # OpenAI's bound on a file sent whole to POST /files
MAX_PART = 64 * 1024 * 1024  # OpenAI's bound on one part
_GONE = ("upload_expired", "upload_cancelled")


@dataclass(slots=True)
class UploadState:
    """The state file's content: the Upload of this input, the parts sent (by index), its File once made."""

    input_sha256: str
    upload_id: str
    created_at: int
    bytes: int
    part_size: int
    part_ids: list[str | None] = field(default_factory=list)
    file_id: str | None = None


def upload_state_path(output: str) -> Path:
    return Path(f"{output}.batchyard-upload.json")


def part_size(text: str) -> int:
    """`--part-size`: bytes, or with a K or M suffix (binary units); 1 byte to 64 MB."""
    units = {"K": 1024, "M": 1024 * 1024}
    number, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    try:
        size = int(float(number) * unit)
    except ValueError:
        raise ValueError(f"{text!r}: expected bytes, or a number with K or M (e.g. 64M)") from None
    if not 0 < size <= MAX_PART:
        raise ValueError(f"{text!r}: a part is 1 byte to 64M (OpenAI's bound)")
    return size


def upload_in_parts(client: OpenAI, path: str, *, sha: str, md5: str, size: int, part_bytes: int, output: str,
                    progress: bool) -> str:
    """The id of the File made of `path` by an Upload: a new one, or the one an earlier run began."""
    state = _load(output, sha, size, part_bytes)
    if state is not None and state.file_id:
        return state.file_id
    if state is not None:
        done = sum(1 for p in state.part_ids if p)
        say(f"resuming upload {state.upload_id}: {done} of {len(state.part_ids)} parts already sent "
            f"(state in {upload_state_path(output)})")
        try:
            return _send(client, path, state, md5, output, progress)
        except (openai.NotFoundError, openai.ConflictError) as exc:
            if isinstance(exc, openai.ConflictError) and exc.code not in _GONE:
                raise
            say(f"upload {state.upload_id} can no longer take parts ({_code(exc)}): starting a new one")
    name = _name(path)
    upload = client.uploads.create(bytes=size, filename=name, mime_type="application/jsonl", purpose="batch")
    count = max(1, -(-size // part_bytes))
    state = UploadState(sha, upload.id, upload.created_at, size, part_bytes, [None] * count)
    _save(output, state)
    say(f"uploading {name} in {count} part(s) of up to {part_bytes / 1e6:.1f} MB as {upload.id}")
    return _send(client, path, state, md5, output, progress)


def drop_upload_state(output: str) -> None:
    upload_state_path(output).unlink(missing_ok=True)


def _send(client: OpenAI, path: str, state: UploadState, md5: str, output: str, progress: bool) -> str:
    bar = _PartBar(state, enabled=progress)
    try:
        with open(path, "rb") as source:
            for index, part_id in enumerate(state.part_ids):
                if part_id:
                    continue
                source.seek(index * state.part_size)
                data = source.read(state.part_size)  # one part in memory, as the SDK's own upload holds
                started = time.monotonic()
                part = client.uploads.parts.create(state.upload_id, data=(_name(path), data))
                state.part_ids[index] = part.id
                _save(output, state)
                bar.sent(index, len(data), time.monotonic() - started)
    finally:
        bar.close()
    part_ids = [p for p in state.part_ids if p]
    try:
        upload = client.uploads.complete(state.upload_id, part_ids=part_ids, md5=md5)
        file_id = upload.file.id if upload.file is not None else None
    except openai.ConflictError as exc:  # completed by an earlier run whose reply was lost
        if exc.code != "upload_already_completed":
            raise
        file_id = _made_file(client, path, state)
    if file_id is None:
        raise openai.OpenAIError(f"upload {state.upload_id} completed without a file")
    state.file_id = file_id
    _save(output, state)
    say(f"uploaded {state.bytes / 1e6:.1f} MB as {file_id}")
    return file_id


def _made_file(client: OpenAI, path: str, state: UploadState) -> str | None:
    """The File an Upload completed by an earlier run made: this team's file of its name and size, made after it
    (there is no `GET /uploads/{id}` to ask)."""
    name = _name(path)
    found = [f for f in client.files.list(purpose="batch")
             if f.filename == name and f.bytes == state.bytes and f.created_at >= state.created_at]
    return min(found, key=lambda f: f.created_at).id if found else None


def _code(exc: openai.APIStatusError) -> str:
    return str(exc.code or exc.status_code)


def _name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] or "batch.jsonl"


def _load(output: str, sha: str, size: int, part_bytes: int) -> UploadState | None:
    """An earlier run's Upload of this input in parts of this size, or None."""
    try:
        state = UploadState(**json.loads(upload_state_path(output).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if (state.input_sha256, state.bytes, state.part_size) != (sha, size, part_bytes):
        return None
    return state


def _save(output: str, state: UploadState) -> None:
    path = upload_state_path(output)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)  # whole or not at all


class _PartBar:
    """Per part: a tqdm bar over the file's bytes on a terminal, a line on stderr otherwise."""

    def __init__(self, state: UploadState, enabled: bool) -> None:
        self.enabled, self.count = enabled, len(state.part_ids)
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            done = sum(min(state.part_size, state.bytes - i * state.part_size)
                       for i, p in enumerate(state.part_ids) if p)
            self.bar = tqdm(total=state.bytes, initial=done, unit="B", unit_scale=True, desc="upload",
                            file=sys.stderr)

    def sent(self, index: int, size: int, seconds: float) -> None:
        rate = size / 1e6 / seconds if seconds > 0 else 0.0
        if self.bar is not None:
            self.bar.update(size)
            self.bar.set_postfix_str(f"part {index + 1}/{self.count}, {rate:.0f} MB/s", refresh=False)
        elif self.enabled:
            say(f"part {index + 1}/{self.count} sent: {size / 1e6:.1f} MB in {seconds:.2f} s ({rate:.0f} MB/s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


__all__ = ["CHUNKED_OVER", "MAX_PART", "UploadState", "drop_upload_state", "part_size", "upload_in_parts",
           "upload_state_path"]
