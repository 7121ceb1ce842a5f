"""A Message Batch create body (`{"requests": [...]}`) read request by request from a spooled file, never
parsed whole: the API's memory for one create stays near one request's, whatever the body's shape.

Why a splitter of our own: what bounds the memory is knowing where a request ends, and how many values
and levels it holds, BEFORE any of it becomes Python objects (a 14 MB request of 5,000,000 `{}` is about
700 MB of dicts). orjson reads only whole documents; ijson's item builder builds the request before it can
be counted, and its event stream, in Python, costs several times what this does. Here one regular
expression (C) jumps from one structural byte to the next, skipping whole strings; the Python loop sees
only brackets, commas and strings, counts them against the bounds, and stops at the request's closing
bracket. Only then is the request's slice read by orjson (`loads_checked`: strict JSON, as before) and
checked as Anthropic checks it (`MessageBatchRequest`).

Refusals are `EnvelopeError`s naming the field (`requests.3.custom_id: …`), as pydantic words them.
"""

from __future__ import annotations

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
_REQUEST_DEPTH = MAX_PARAMS_DEPTH + 1  # the request object itself is the first level
_WINDOW = 1 << 20  # bytes read from the spool at a time (more while one request is larger)
_LINES_PER_WRITE = 500

# A whole string (escapes included), or one structural byte; a lone `"` is a string not ended yet.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|["{}\[\],]', re.S)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SPACE = re.compile(rb"[ \t\r\n]*")
# Where a request most likely ends: a closing brace, then the next request's first key (the last request,
# and one cut by the window, are walked). A guess only: it is
# taken when the slice up to it reads as one JSON object (JSON objects are prefix-free, so that slice IS the
# request); otherwise the request is walked token by token (`value_end`).
_LIKELY_END = re.compile(rb'\}[ \t\r\n]*,[ \t\r\n]*\{[ \t\r\n]*"(?:custom_id|params)"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
_STRIP_PASSES = 8
_GUESS_SLACK = 16 << 20  # bytes a body's missed guesses may scan past the bytes of its requests
_OPEN, _CLOSE, _COMMA, _QUOTE = frozenset(b"{["), frozenset(b"}]"), ord(","), ord('"')


class NotJson(EnvelopeError):
    """The body is not (strict) JSON."""


class _Reader:
    """The spool as a sliding window: `buf[pos:]` is what is not read yet."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source, self.buf, self.pos, self.eof = source, b"", 0, False
        self.read = self.missed = 0  # bytes of requests read; bytes scanned or parsed by guesses that missed

    def more(self) -> bool:
        """Read more (as much again as is held, so a large request is re-scanned a bounded number of times)."""
        if self.eof:
            return False
        data = self.source.read(max(_WINDOW, len(self.buf) - self.pos))
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> int | None:
        """The next byte past whitespace (None at the end), `pos` moved onto it."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return None

    def expect(self, byte: bytes) -> None:
        if self.peek() != byte[0]:
            raise NotJson(f"The request body is not valid JSON (expected {byte.decode()!r}).")
        self.pos += 1

    def string(self) -> str:
        while self.peek() != _QUOTE or (m := _STRING.match(self.buf, self.pos)) is None:
            if self.peek() != _QUOTE or not self.more():
                raise NotJson("The request body is not valid JSON (expected a string).")
        self.pos = m.end()
        value = loads_checked(m.group(), None)
        assert isinstance(value, str)
        return value

    def value_end(self, index: int) -> int:
        """Where the container starting at `pos` ends, its values and depth counted on the way; `pos` is
        left on its first byte."""
        depth = values = 0
        at = self.pos
        while True:
            start = self.pos
            for m in _TOKEN.finditer(self.buf, at):
                byte, at = self.buf[m.start()], m.end()
                if byte in _OPEN:
                    depth += 1
                    values += 1
                    if depth > _REQUEST_DEPTH:
                        raise EnvelopeError(f"requests.{index}.params: nested more than {MAX_PARAMS_DEPTH} levels "
                                            "deep.")
                elif byte in _CLOSE:
                    depth -= 1
                    if depth == 0:
                        return at
                elif byte == _COMMA:
                    values += 1
                elif at - m.start() == 1:  # a string not ended within what is read
                    at = m.start()
                    break
                if values > MAX_REQUEST_VALUES:
                    raise EnvelopeError(f"requests.{index}: more than {MAX_REQUEST_VALUES} values (objects, lists "
                                        "and their members) in one request.")
            consumed = at - start
            if not self.more():
                raise NotJson("The request body is not valid JSON (it ends inside a request).")
            at = consumed  # `more` moved the window: `start` is now 0


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


def _next_request(reader: _Reader, index: int) -> Any:
    """The request at `pos`, read, `pos` moved past it: by its likely end when the slice up to it reads
    as one object within the bounds, else walked. Guesses stop once their misses have cost more than the
    body's requests (a body shaped so that every guess misses is walked, never scanned again and again)."""
    start = reader.pos
    if reader.missed <= reader.read + _GUESS_SLACK:
        guess = _LIKELY_END.search(reader.buf, start)
        end = guess.start() + 1 if guess is not None else len(reader.buf)
        if guess is not None and _within_bounds(raw := reader.buf[start:end]):
            try:
                data = loads_checked(raw, None)
            except ValueError:
                pass  # a guess inside a string: walked below
            else:
                reader.pos, reader.read = end, reader.read + end - start
                return data
        reader.missed += end - start
    end = reader.value_end(index)  # `pos` stays on the request's first byte (the window may move under it)
    data = _parsed(reader.buf[reader.pos:end])
    reader.read += end - reader.pos
    reader.pos = end
    return data


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
        request = _request(_next_request(reader, count), count)
        if request.custom_id in seen:
            raise EnvelopeError(f"requests.{count}.custom_id: Duplicate custom_id '{request.custom_id}'; each "
                                "request in a Message Batch needs a unique custom_id.")
        seen.add(request.custom_id)
        lines.append(dumps(input_line(request)))
        count += 1
        if len(lines) >= _LINES_PER_WRITE:
            sink.write(b"\n".join(lines) + b"\n")
            lines.clear()
        nxt = reader.peek()
        reader.pos += 1
        if nxt == ord("]"):
            break
        if nxt != _COMMA:
            raise NotJson("The request body is not valid JSON (expected ',' or ']' after a request).")
    if lines:
        sink.write(b"\n".join(lines) + b"\n")
    return count


def read_create(source: IO[bytes], sink: IO[bytes]) -> int:
    """The create body in `source` checked as Anthropic checks it, its requests written to `sink` as the
    pipeline's input lines (`/v1/messages` calls, one per line); returns how many. Only the envelope is
    checked (`requests` within Anthropic's limits, each `custom_id` by its rule, `params` an object) and
    each request's values and depth; its params are checked when it runs."""
    reader = _Reader(source)
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


__all__ = ["MAX_REQUEST_VALUES", "NotJson", "read_create"]
