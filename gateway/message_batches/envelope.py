"""A Message Batch create body (`{"requests": [...]}`) read request by request from a spooled file, never
parsed whole: the reading process holds one chunk of the body and one request's objects, whatever the
body's content (escapes, long strings, deep or wide values).

The body goes through a real streaming JSON tokenizer, ijson's C backend (yajl): it reads the file a chunk at
a time and hands out one event per token (a string arrives decoded, escapes and all, in linear time and
memory). Each request is built from its events here, its values and depth counted as they arrive, so a
request past the bounds is refused before it becomes more Python objects than the bounds allow (a 14 MB
request of 5,000,000 `{}` is about 700 MB of dicts); and its size is checked on the bytes as they stream in,
so a request past the Messages API's 32 MB is refused before the tokenizer reads past it. Each request
is then checked as Anthropic checks it (`MessageBatchRequest`) and written as an input line.

Refusals are `EnvelopeError`s naming the field (`requests.3.custom_id: …`), as pydantic words them.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import IO, Any

import ijson
from pydantic import ValidationError

from gateway.json_codec import dumps
from gateway.message_batches.wire import (
    MAX_PARAMS_DEPTH,
    MAX_REQUESTS,
    EnvelopeError,
    MessageBatchRequest,
    input_line,
)

# Values (containers, and every member of a list or an object) one request may hold: far past any real
# request's (a long conversation with tools is a few thousand), and at most ~100 bytes of Python objects
# each, so one request read never costs more than ~10 MB past its own text.
MAX_REQUEST_VALUES = 100_000
# Bytes one request may take: the Messages API's own request limit (32 MB), which a batch's request is held
# to as well. It also keeps one request's objects and its line inside the create's memory bound.
MAX_REQUEST_BYTES = 32 * 1024 * 1024
_REQUEST_DEPTH = MAX_PARAMS_DEPTH + 1  # the request object itself is the first level
_CHUNK = 64 * 1024  # bytes the tokenizer reads at a time
# yajl lexes a token that spans chunks again from its start with each chunk: within a long request the
# chunks grow with it (to this much), so a long string is lexed a few times over, never once per chunk
# (64 KB chunks: a 30 MB string of escapes took 95 s).
_MAX_CHUNK = 8 * 1024 * 1024
_LINES_PER_WRITE = 500
# The C tokenizer, named: the pure-Python backends would hold the same bounds at several times the CPU.
_YAJL = ijson.get_backend("yajl2_c")

Events = Iterator[tuple[str, Any]]


class NotJson(EnvelopeError):
    """The body is not (strict) JSON."""


class _Stream:
    """The body for the tokenizer, a chunk at a time, its bytes counted. While a request is read
    (`request(index)`), a read once more than `MAX_REQUEST_BYTES` have streamed past the chunk it began in is
    refused (the request is longer than that for sure). The tokenizer's events come a chunk at a time, so
    where a request begins is known to a chunk: its part of that chunk is not counted (64 KB, or up to
    `_MAX_CHUNK` after a long request); none is ever refused under the bound."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self.done = 0  # bytes read so far
        self._from: int | None = None
        self._index = 0

    def read(self, size: int) -> bytes:
        if self._from is not None and self.done - self._from > MAX_REQUEST_BYTES:
            raise EnvelopeError(f"requests.{self._index}: more than {MAX_REQUEST_BYTES} bytes; a request is at most "
                                f"{MAX_REQUEST_BYTES} bytes (the Messages API's request size limit)")
        if self._from is not None:  # grown with the request, but never read past its bound in one go
            size = max(size, min(self.done - self._from, _MAX_CHUNK, self._from + MAX_REQUEST_BYTES + 1 - self.done))
        chunk = self._source.read(size)
        self.done += len(chunk)
        return chunk

    def request(self, index: int | None) -> None:
        """A request begins in the last chunk read (None: it has ended)."""
        self._index = index or 0
        self._from = None if index is None else self.done


def _build(events: Events, index: int) -> dict[str, Any]:
    """The request whose `start_map` was just read, built from its events, its values and depth counted on
    the way (a container is placed in its parent as it opens, so the counts hold before it fills)."""
    root: dict[str, Any] = {}
    parents: list[Any] = []
    top: Any = root
    in_map = True  # whether `top` is a dict (kept beside it: a test of the type per event costs more)
    key: Any = None
    room = MAX_REQUEST_VALUES - 1  # values the request may still hold
    depth_room = _REQUEST_DEPTH - 1  # levels it may still open
    for event, value in events:
        if event == "map_key":
            key = value
        elif event == "end_map" or event == "end_array":
            if not parents:
                return root
            top = parents.pop()
            in_map = type(top) is dict
            depth_room += 1
        elif event == "start_map" or event == "start_array":
            room -= 1
            depth_room -= 1
            if room < 0 or depth_room < 0:
                _over(index, room)
            new: Any = {} if event == "start_map" else []
            if in_map:
                top[key] = new
            else:
                top.append(new)
            parents.append(top)
            top, in_map = new, event == "start_map"
        else:
            room -= 1
            if room < 0:
                _over(index, room)
            if event == "number" and type(value) is Decimal:
                value = float(value)  # a finite one: yajl refuses 1e400 itself; integers stay exact
            if in_map:
                top[key] = value
            else:
                top.append(value)
    raise NotJson("The request body is not valid JSON (it ends inside a request).")


def _over(index: int, room: int) -> None:
    if room < 0:
        raise EnvelopeError(f"requests.{index}: more than {MAX_REQUEST_VALUES} values (objects, lists and their "
                            "members) in one request.")
    raise EnvelopeError(f"requests.{index}.params: nested more than {MAX_PARAMS_DEPTH} levels deep.")


def _request(data: Any, index: int) -> MessageBatchRequest:
    try:
        return MessageBatchRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in ("requests", index, *first["loc"]))
        raise EnvelopeError(f"{where}: {first['msg']}") from None


def _requests(events: Events, stream: _Stream, sink: IO[bytes]) -> int:
    """The `requests` list, each written to `sink` as an input line; returns how many."""
    event, _ = next(events)
    if event != "start_array":
        raise EnvelopeError("requests: Input should be a valid list")
    seen: set[str] = set()
    lines: list[bytes] = []
    count = 0
    for event, _ in events:
        if event == "end_array":
            break
        if count >= MAX_REQUESTS:
            raise EnvelopeError(f"requests: List should have at most {MAX_REQUESTS} items after validation")
        if event != "start_map":
            raise EnvelopeError(f"requests.{count}: Input should be a valid dictionary or instance of "
                                "MessageBatchRequest")
        stream.request(count)
        data = _build(events, count)
        stream.request(None)
        request = _request(data, count)
        del data
        if request.custom_id in seen:
            raise EnvelopeError(f"requests.{count}.custom_id: Duplicate custom_id '{request.custom_id}'; each "
                                "request in a Message Batch needs a unique custom_id.")
        seen.add(request.custom_id)
        count += 1
        lines.append(dumps(input_line(request)))
        del request
        if len(lines) >= _LINES_PER_WRITE:
            _write(sink, lines)
    if count == 0:
        raise EnvelopeError("requests: List should have at least 1 item after validation, not 0")
    _write(sink, lines)
    return count


def _write(sink: IO[bytes], lines: list[bytes]) -> None:
    """The lines, each with its newline, never joined."""
    sink.writelines(part for line in lines for part in (line, b"\n"))
    lines.clear()


def read_create(source: IO[bytes], sink: IO[bytes]) -> int:
    """The create body in `source` checked as Anthropic checks it, its requests written to `sink` as the
    pipeline's input lines (`/v1/messages` calls, one per line); returns how many. Only the envelope is
    checked (`requests` within Anthropic's limits, each `custom_id` by its rule, `params` an object) and
    each request's size, values and depth; its params are checked when it runs."""
    stream = _Stream(source)
    events: Events = _YAJL.basic_parse(stream, buf_size=_CHUNK)
    try:
        return _body(events, stream, sink)
    except ijson.JSONError as exc:
        # yajl's first line names the fault; the next ones quote the body back, which a 400 has no need of
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "it ends early"
        raise NotJson(f"The request body is not valid JSON ({reason}).") from None
    except StopIteration:
        raise NotJson("The request body is not valid JSON (it ends early).") from None


def _body(events: Events, stream: _Stream, sink: IO[bytes]) -> int:
    event, _ = next(events)
    if event != "start_map":
        raise EnvelopeError("body: Input should be a valid dictionary or object to extract fields from")
    count: int | None = None
    for event, key in events:
        if event == "end_map":
            break
        if key != "requests":
            raise EnvelopeError(f"{key}: Extra inputs are not permitted")
        if count is not None:
            raise EnvelopeError("requests: given twice")
        count = _requests(events, stream, sink)
    for _ in events:  # the tokenizer refuses anything after the object but spaces
        raise NotJson("The request body is not valid JSON (extra data after the object).")
    if count is None:
        raise EnvelopeError("requests: Field required")
    return count


__all__ = ["MAX_REQUEST_BYTES", "MAX_REQUEST_VALUES", "NotJson", "read_create"]
