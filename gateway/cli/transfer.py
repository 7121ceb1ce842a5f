"""Where `batchyard run` reads its input and writes its output.

`-i`: a local path, `-` (stdin) or an http(s) URL (streamed GET).
`-o`: a local path, `-` (stdout) or an http(s) URL (streamed PUT with
Content-Length, as a presigned S3 URL needs; retried with backoff by
`providers.retry_policy`, only a 2xx counts).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import httpx
from tenacity import RetryCallState

from providers.retry_policy import put_retrying

_CHUNK = 1 << 16
_PUT_ATTEMPTS = 5


class TransferError(Exception):
    pass


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


async def read_source(spec: str) -> AsyncIterator[bytes]:
    """The bytes of `-i`, streamed."""
    if spec == "-":
        stdin = sys.stdin.buffer
        while chunk := await asyncio.to_thread(stdin.read1, _CHUNK):  # type: ignore[union-attr]
            yield chunk
        return
    if is_url(spec):
        client = httpx.AsyncClient(timeout=httpx.Timeout(60.0), follow_redirects=True)
        async with client, client.stream("GET", spec) as reply:
            if reply.status_code // 100 != 2:
                raise TransferError(f"GET {_redact(spec)} answered HTTP {reply.status_code}")
            async for chunk in reply.aiter_bytes(_CHUNK):
                yield chunk
        return
    path = Path(spec)
    if not path.is_file():
        raise TransferError(f"input file {spec} does not exist")
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def source_name(spec: str) -> str:
    """The name `-i` is stored under: a URL's last path segment, never its query (a presigned URL's
    signature is a credential, and the stored name is shown and kept in the data dir)."""
    if is_url(spec):
        return PurePosixPath(urlsplit(spec).path).name or "input.jsonl"
    return Path(spec).name or "input.jsonl"


def _redact(url: str) -> str:
    # A presigned URL's query string is a credential: never print it.
    return url.split("?", 1)[0] + ("?…" if "?" in url else "")


# Opens the finished file (again for each attempt at a PUT): its bytes, streamed.
Reader = Callable[[], AsyncIterator[bytes]]


async def deliver(read: Reader, size: int, dest: str, *, on_retry: Callable[[str], None] | None = None) -> None:
    """Copy the finished file (`size` bytes from `read`) to `dest`."""
    if dest == "-":
        async for chunk in read():
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        return
    if is_url(dest):
        await _put(read, size, dest, on_retry)
        return
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.partial")
    with tmp.open("wb") as out:
        async for chunk in read():
            out.write(chunk)
    os.replace(tmp, target)


async def _put(read: Reader, size: int, url: str, on_retry: Callable[[str], None] | None) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:

        async def attempt() -> str | None:  # None: stored; else why not
            try:
                reply = await client.put(url, content=read(), headers={"Content-Length": str(size)})
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"
            return None if reply.status_code // 100 == 2 else f"HTTP {reply.status_code}"

        def retrying(state: RetryCallState) -> None:
            if on_retry is not None:
                why = state.outcome.result() if state.outcome is not None else ""
                on_retry(f"PUT {_redact(url)} failed ({why}); retry {state.attempt_number}/{_PUT_ATTEMPTS - 1}")

        last: str | None = await put_retrying(_PUT_ATTEMPTS, retrying)(attempt)
    if last is not None:
        raise TransferError(f"PUT {_redact(url)} failed after {_PUT_ATTEMPTS} attempts: {last}")
