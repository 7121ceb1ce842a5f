"""A streamed multipart/form-data body, read as events.

The body comes straight from ASGI `receive`, chunk by chunk, through
python-multipart's push parser; events come out in body order, so a file part
is seen as `FileStart`, its bytes as `FileData` (one chunk at a time, never the
whole file) and `FileEnd`. Nothing holds more than one network chunk of a file.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from gateway.api.http_errors import ApiError
from gateway.errors import shown

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks


@dataclass(slots=True)
class Field:
    name: str
    value: str


@dataclass(slots=True)
class FileStart:
    name: str
    filename: str


@dataclass(slots=True)
class FileData:
    data: bytes


@dataclass(slots=True)
class FileEnd:
    pass


Event = Field | FileStart | FileData | FileEnd
# A part's headers (Content-Disposition with its name and filename, Content-Type), together: far more than
# any client sends; python-multipart buffers them whole, so the cap is ours.
MAX_PART_HEADER_BYTES = 16 * 1024


class Body:
    """The request body from ASGI `receive`; what a reply leaves unread can be drained."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self.done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.done = True
                raise ClientDisconnect()
            self.done = not message.get("more_body", False)
            body = message.get("body", b"")
            if body:
                yield body

    async def drain(self, limit: int) -> None:
        """Read and drop up to `limit` more bytes, so the client gets to read our reply."""
        seen = 0
        try:
            async for chunk in self.chunks():
                seen += len(chunk)
                if seen > limit:
                    return
        except ClientDisconnect:
            return


def declared_length(headers: Mapping[str, str]) -> int | None:
    """A request's `Content-Length`, when it sends one (a number; anything else is a 400)."""
    value = headers.get("content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise ApiError(400, "The Content-Length header is not a number.", code="invalid_content_length")
    return int(value)


async def read_capped(request: Request, limit: int) -> bytes:
    """A small body (a JSON create, a form), bounded before it is parsed: its declared length first, then the
    bytes as they stream (413 `request_too_large` past `limit`, without holding more than `limit`)."""
    too_large = ApiError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
    if (declared := declared_length(request.headers)) is not None and declared > limit:
        raise too_large
    raw = bytearray()
    async for chunk in Body(request.receive).chunks():
        raw += chunk
        if len(raw) > limit:
            raise too_large
    return bytes(raw)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_multipart" if param is None else None)


class FormReader:
    """Events of a multipart/form-data body, in order, as the body streams in."""

    def __init__(self, content_type: str, body: Body, *, max_field_bytes: int = 64 * 1024, max_parts: int = 64):
        ctype, options = parse_options_header(content_type)
        if ctype != b"multipart/form-data" or not options.get(b"boundary"):
            raise ApiError(
                400,
                "Expected a multipart/form-data body with a 'file' and a 'purpose'.",
                code="invalid_content_type",
            )
        self._boundary = options[b"boundary"]
        self._body = body
        self._max_field_bytes = max_field_bytes
        self._max_parts = max_parts
        self._parts = 0
        self._pending: list[Event] = []
        self._ended = False
        # the part being parsed
        self._header_name = b""
        self._header_value = b""
        self._header_bytes = 0  # of the part being parsed
        self._disposition = b""
        self._is_file = False
        self._name = ""
        self._data = bytearray()

    async def events(self) -> AsyncGenerator[Event, None]:
        parser = MultipartParser(self._boundary, self._callbacks())
        try:
            async for chunk in self._body.chunks():
                parser.write(chunk)
                while self._pending:
                    pending, self._pending = self._pending, []
                    for event in pending:
                        yield event
            parser.finalize()
        except FormParserError:
            raise _bad("The multipart body is malformed.") from None
        for event in self._pending:
            yield event
        self._pending = []
        if not self._ended:
            raise _bad("The multipart body ended before its closing boundary.")

    def _callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._on_part_begin,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_end": self._on_end,
        }

    def _on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > self._max_parts:
            raise _bad(f"Too many form fields (at most {self._max_parts}).")
        self._disposition, self._is_file, self._name = b"", False, ""
        self._data = bytearray()
        self._header_bytes = 0

    def _header_data(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise _bad(f"A form part's headers are longer than {MAX_PART_HEADER_BYTES} bytes.")

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_data(end - start)
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_data(end - start)
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        if self._header_name.strip().lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise _bad("A form part has no Content-Disposition name.")
        self._name = options[b"name"].decode("utf-8", "replace")
        filename = options.get(b"filename")
        self._is_file = filename is not None
        if filename is not None:
            self._pending.append(FileStart(self._name, filename.decode("utf-8", "replace")))

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self._pending.append(FileData(bytes(data[start:end])))
            return
        if len(self._data) + (end - start) > self._max_field_bytes:
            raise _bad(f"Form field '{shown(self._name)}' is too long.", param=shown(self._name))
        self._data += data[start:end]

    def _on_part_end(self) -> None:
        if self._is_file:
            self._pending.append(FileEnd())
        else:
            self._pending.append(Field(self._name, self._data.decode("utf-8", "replace")))

    def _on_end(self) -> None:
        self._ended = True
