"""A Message Batch create body (`{"requests": [...]}`) read request by request from a spooled file, never
parsed whole: the API's memory for one create stays near one request's, whatever the body's shape.

Why a splitter of our own: what bounds the memory is knowing where a request ends, and how many values
and levels it holds, BEFORE any of it becomes Python objects (a 14 MB request of 5,000,000 `{}` is about
700 MB of dicts). orjson reads only whole documents; ijson's item builder builds the request before it can
be counted, and its event stream, in Python, costs several times what this does. Here one regular
expression (C) jumps from one structural byte to the next, skipping whole strings; the Python loop sees
only brackets, commas and strings, counts them against the bounds, and stops at the request's closing
bracket. Only then is the request's slice read by orjson (`loads_checked`: strict JSON, the same reader
every input line gets) and checked as Anthropic checks it (`MessageBatchRequest`).

Refusals are `EnvelopeError`s naming the field (`requests.3.custom_id: …`), as pydantic words them.
"""

from __future__ import annotations

import io
import mmap
import os
import re
from typing import IO, Any

from pydantic import ValidationError

from gateway.json_codec import dumps, loads_checked
from gateway.message_batches.wire import (
    MAX_PARAMS_DEPTH,
    MAX_REQUESTS,
    EnvelopeError,
    MessageBatchRequest,
    input_line,
)

# Values (containers and list or object members) one request may hold: far past any real request's (a
# long conversation with tools is a few thousand), and at most ~100 bytes of Python objects each, so one
# request read never costs more than ~10 MB past its own text.
MAX_REQUEST_VALUES = 100_000
# Bytes one request may take: the Messages API's own request limit (32 MB), which a batch's request is held
# to as well. It also keeps one request's text and objects inside the create's memory bound (a request's
# objects are about its size again; past ~45 MB the API process outgrew 2x the body + 50 MB).
MAX_REQUEST_BYTES = 32 * 1024 * 1024
_REQUEST_DEPTH = MAX_PARAMS_DEPTH + 1  # the request object itself is the first level
_WINDOW = 1 << 20  # bytes of the body passed between two releases of its pages; a "large" request is longer
_LINES_PER_WRITE = 500

# A whole string (escapes included), or one structural byte; a lone `"` is a string not ended yet.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|["{}\[\],]', re.S)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SPACE = re.compile(rb"[ \t\r\n]*")
# Where a request most likely ends: a closing brace, then the next request's first key (the last request,
# and one cut by the window, are walked). A guess only: it is
# taken when the slice up to it reads as one JSON object (JSON objects are prefix-free, so that slice IS the
# request); otherwise the request is walked token by token (`value_end`). Found from the key back
# (`_likely_end`): a regex starting at `}` tried every brace of a request of `{}`s (22 us per 2 KB).
_NEXT_KEYS = (b'"custom_id"', b'"params"')
_JSON_SPACE = frozenset(b" \t\r\n")
_KEY_TRIES = 16  # places a key is found at and refused, per key and guess (a request's own keys are two)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
_STRIP_PASSES = 8  # a pass drops up to two levels: 2 x 8 is within the depth bound
_GUESS_SLACK = 16 << 20  # bytes a body's missed guesses may scan past the bytes of its requests
_GUESS_BYTES = 4 << 20  # a request longer than this is walked (its guess would copy it)
_WS = rb"[ \t\r\n]*"
_ID_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_ID_THEN_PARAMS = re.compile(rb'\{' + _WS + rb'"custom_id"' + _WS + b":" + _WS + _ID_STRING + _WS + b"," + _WS
                             + rb'"params"' + _WS + b":" + _WS)
_PARAMS_FIRST = re.compile(rb'\{' + _WS + rb'"params"' + _WS + b":" + _WS)
_THEN_ID = re.compile(_WS + b"," + _WS + rb'"custom_id"' + _WS + b":" + _WS + _ID_STRING + _WS + rb"\}\Z")
_NEWLINE = re.compile(rb"[\r\n]")
_SPACES = bytes.maketrans(b"\r\n", b"  ")
_OPEN, _CLOSE, _COMMA, _QUOTE = frozenset(b"{["), frozenset(b"}]"), ord(","), ord('"')


class NotJson(EnvelopeError):
    """The body is not (strict) JSON."""


class _Reader:
    """The spooled body, mapped (`buf`: its pages are read in as the parse reaches them, and let go once it
    has passed them, so the process holds a window of the body, never all of it); `pos`: the next byte."""

    def __init__(self, source: IO[bytes]) -> None:
        self._map: mmap.mmap | None = None
        try:
            fd = source.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.buf: bytes | mmap.mmap = source.read()  # a body in memory already (the unit tests')
        else:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
            self.buf = self._map if self._map is not None else b""
        self.pos = self._released = 0
        self.read = self.missed = 0  # bytes of requests read; bytes scanned or parsed by guesses that missed

    def close(self) -> None:
        if self._map is not None:
            self._map.close()

    def release(self) -> None:
        """Let go of the pages before `pos` (the file keeps them; this process's memory does not)."""
        if self._map is not None and self.pos - self._released >= _WINDOW:
            upto = self.pos - self.pos % mmap.PAGESIZE
            self._map.madvise(mmap.MADV_DONTNEED, self._released, upto - self._released)
            self._released = upto

    def peek(self) -> int | None:
        """The next byte past whitespace (None at the end), `pos` moved onto it."""
        self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
        return self.buf[self.pos] if self.pos < len(self.buf) else None

    def expect(self, byte: bytes) -> None:
        if self.peek() != byte[0]:
            raise NotJson(f"The request body is not valid JSON (expected {byte.decode()!r}).")
        self.pos += 1

    def string(self) -> str:
        if self.peek() != _QUOTE or (m := _STRING.match(self.buf, self.pos)) is None:
            raise NotJson("The request body is not valid JSON (expected a string).")
        self.pos = m.end()
        value = loads_checked(m.group(), None)
        assert isinstance(value, str)
        return value

    def value_end(self, index: int) -> int:
        """Where the container starting at `pos` ends, its values and depth counted on the way."""
        depth = values = 0
        for m in _TOKEN.finditer(self.buf, self.pos):
            byte = self.buf[m.start()]
            if byte in _OPEN:
                depth += 1
                values += 1
                if depth > _REQUEST_DEPTH:
                    raise EnvelopeError(f"requests.{index}.params: nested more than {MAX_PARAMS_DEPTH} levels deep.")
            elif byte in _CLOSE:
                depth -= 1
                if depth == 0:
                    return m.end()
            elif byte == _COMMA:
                values += 1
            elif m.end() - m.start() == 1:  # a string never ended
                break
            if values > MAX_REQUEST_VALUES:
                raise EnvelopeError(f"requests.{index}: more than {MAX_REQUEST_VALUES} values (objects, lists "
                                    "and their members) in one request.")
        raise NotJson("The request body is not valid JSON (it ends inside a request).")


def _within_bounds(raw: bytes) -> bool:
    """Whether a request's text keeps to the bounds, found by counts in C where that can be: brackets and
    commas counted strings and all (never fewer than its values); past the depth bound's number of
    brackets, its brackets alone (strings dropped) emptied of `{}` and `[]` a few times over, as many levels
    a pass at most (past those passes the request is walked)."""
    opens = raw.count(b"{") + raw.count(b"[")
    if opens + raw.count(b",") > MAX_REQUEST_VALUES:
        return False
    if opens <= _REQUEST_DEPTH:
        return True
    text = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(_STRIP_PASSES):  # a pass drops one level, or two where `{}` and `[]` alternate
        text = text.replace(b"{}", b"").replace(b"[]", b"")
        if not text:
            return True  # no deeper than twice the passes, within the bound
    return False


def _parsed(raw: bytes) -> Any:
    try:
        return loads_checked(raw, None)  # its depth bounded by the caller
    except ValueError as exc:
        raise NotJson(f"The request body is not valid JSON ({exc}).") from None


def _request(data: Any, index: int) -> MessageBatchRequest:
    try:
        return MessageBatchRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in ("requests", index, *first["loc"]))
        raise EnvelopeError(f"{where}: {first['msg']}") from None


def _likely_end(buf: bytes | mmap.mmap, start: int, stop: int) -> int | None:
    """The first `}` at or past `start` followed by `,`, `{` and one of the keys (spaces between), all
    before `stop`: found by looking for the keys (`find`, in C) and then back from each."""
    best: int | None = None
    for key in _NEXT_KEYS:
        at = start
        for _ in range(_KEY_TRIES):  # a request full of these keys as values is walked, not searched key by key
            found = buf.find(key, at, stop if best is None else min(stop, best + 1 + len(key) + 64))
            if found < 0:
                break
            brace = _before(buf, found, ord("{"), start)
            comma = _before(buf, brace, _COMMA, start) if brace is not None else None
            close = _before(buf, comma, ord("}"), start) if comma is not None else None
            if close is not None:
                best = close if best is None else min(best, close)
                break
            at = found + 1
    return best


def _before(buf: bytes | mmap.mmap, pos: int, byte: int, start: int) -> int | None:
    """Where `byte` is just before `pos`, spaces between; None if something else is (or `start` is passed)."""
    pos -= 1
    while pos >= start and buf[pos] in _JSON_SPACE:
        pos -= 1
    return pos if pos >= start and buf[pos] == byte else None


def _next_request(reader: _Reader, index: int) -> tuple[Any, int]:
    """The request at `pos`, read, and where it ends (`pos` stays on its first byte): by its likely end
    when the slice up to it reads as one object within the bounds, else walked. Guesses stop once their
    misses have cost more than the body's requests (a body shaped so that every guess misses is walked,
    never scanned again and again)."""
    start = reader.pos
    if reader.missed <= reader.read + _GUESS_SLACK:
        guess = _likely_end(reader.buf, start, start + _GUESS_BYTES)
        end = guess + 1 if guess is not None else min(len(reader.buf), start + _GUESS_BYTES)
        if guess is not None and _within_bounds(raw := reader.buf[start:end]):
            try:
                data = loads_checked(raw, None)
            except ValueError:
                pass  # a guess inside a string: walked below
            else:
                reader.read += end - start
                return data, end
        reader.missed += end - start
    end = reader.value_end(index)
    if end - start > MAX_REQUEST_BYTES:
        raise EnvelopeError(f"requests.{index}: {end - start} bytes; a request is at most {MAX_REQUEST_BYTES} bytes "
                            "(the Messages API's request size limit)")
    with memoryview(reader.buf) as view, view[reader.pos:end] as text:
        data = _parsed(text)  # read in place: a large request is not copied
    reader.read += end - reader.pos
    return data, end


def _params_span(reader: _Reader, end: int) -> tuple[int, int] | None:
    """Where the params of the request at `pos` (ending at `end`) lie in its text, when its two keys are
    written plainly (no escapes in their names); None otherwise."""
    if (first := _ID_THEN_PARAMS.match(reader.buf, reader.pos, end)) is not None:
        start, stop = first.end(), end - 1  # up to the request's closing brace
    elif (head := _PARAMS_FIRST.match(reader.buf, reader.pos, end)) is not None and \
            (tail := _THEN_ID.search(reader.buf, max(head.end(), end - 1024), end)) is not None:
        start, stop = head.end(), tail.start()
    else:
        return None
    # The params object must fill the span, past a repeated key's value (JSON keeps the last) as well.
    closed = _container_end(reader.buf, start, stop)
    return (start, stop) if closed is not None and not reader.buf[closed:stop].strip(b" \t\r\n") else None


def _container_end(buf: bytes | mmap.mmap, start: int, stop: int) -> int | None:
    depth = 0
    for m in _TOKEN.finditer(buf, start, stop):
        byte = buf[m.start()]
        if byte in _OPEN:
            depth += 1
        elif byte in _CLOSE:
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def _write_from_text(sink: IO[bytes], reader: _Reader, custom_id: str, span: tuple[int, int]) -> None:
    """A large request's input line, its params copied from the body's text in pieces (line breaks between
    tokens made spaces: JSON strings hold none), never built whole."""
    sink.write(b'{"custom_id":' + dumps(custom_id) + b',"method":"POST","url":"/v1/messages","body":')
    with memoryview(reader.buf) as view:
        for at in range(span[0], span[1], _WINDOW):
            with view[at:min(at + _WINDOW, span[1])] as piece:
                sink.write(bytes(piece).translate(_SPACES) if _NEWLINE.search(piece) else piece)
    sink.write(b"}\n")


def _requests(reader: _Reader, sink: IO[bytes]) -> int:
    """The `requests` list, each written to `sink` as an input line; returns how many."""
    reader.expect(b"[")
    if reader.peek() == ord("]"):
        raise EnvelopeError("requests: List should have at least 1 item after validation, not 0")
    seen: set[str] = set()
    lines: list[bytes] = []
    count = 0
    while True:
        if count >= MAX_REQUESTS:
            raise EnvelopeError(f"requests: List should have at most {MAX_REQUESTS} items after validation")
        if reader.peek() not in (ord("{"), None):
            raise EnvelopeError(f"requests.{count}: Input should be a valid dictionary or instance of "
                                "MessageBatchRequest")
        data, end = _next_request(reader, count)
        request = _request(data, count)
        del data
        if request.custom_id in seen:
            raise EnvelopeError(f"requests.{count}.custom_id: Duplicate custom_id '{request.custom_id}'; each "
                                "request in a Message Batch needs a unique custom_id.")
        seen.add(request.custom_id)
        count += 1
        span = _params_span(reader, end) if end - reader.pos > _WINDOW else None
        if span is not None:
            # A large request: its objects go before its line is written from its text (memory: its text and
            # its objects once each, never a third copy).
            custom_id = request.custom_id
            del request
            _write(sink, lines)
            _write_from_text(sink, reader, custom_id, span)
        else:
            lines.append(dumps(input_line(request)))
            del request
        reader.pos = end
        reader.release()
        if len(lines) >= _LINES_PER_WRITE:
            _write(sink, lines)
        nxt = reader.peek()
        reader.pos += 1
        if nxt == ord("]"):
            break
        if nxt != _COMMA:
            raise NotJson("The request body is not valid JSON (expected ',' or ']' after a request).")
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
    each request's values and depth; its params are checked when it runs."""
    reader = _Reader(source)
    try:
        return _body(reader, sink)
    finally:
        reader.close()


def _body(reader: _Reader, sink: IO[bytes]) -> int:
    if reader.peek() != ord("{"):
        if reader.peek() in (ord("["), ord('"')) or (reader.peek() or 0) in b"-0123456789tfn":
            raise EnvelopeError("body: Input should be a valid dictionary or object to extract fields from")
        raise NotJson("The request body is not valid JSON.")
    reader.pos += 1
    count: int | None = None
    closed = reader.peek() == ord("}")
    while not closed:
        key = reader.string()
        reader.expect(b":")
        if key != "requests":
            raise EnvelopeError(f"{key}: Extra inputs are not permitted")
        if count is not None:
            raise EnvelopeError("requests: given twice")
        count = _requests(reader, sink)
        closed = reader.peek() == ord("}")
        if not closed:
            reader.expect(b",")
    reader.pos += 1
    if reader.peek() is not None:
        raise NotJson("The request body is not valid JSON (extra data after the object).")
    if count is None:
        raise EnvelopeError("requests: Field required")
    return count


__all__ = ["MAX_REQUEST_BYTES", "MAX_REQUEST_VALUES", "NotJson", "read_create"]
