"""JSON for the per-request hot path (journal, shard files, merge): orjson, with the standard library
behind it where orjson would be wrong, so nothing a provider or a user sent is changed by the faster
codec: orjson refuses to write integers past 64 bits and non-string keys, and reads such integers as
floats, so a text with a run of 20 digits or more is read by `json`. Output is compact, as the merged
files always were.

`loads_checked` reads what a team sent (batch lines, request bodies): strict JSON only, and never deeper
than the caller's bound, so nothing downstream (orjson's writer stops at 254 levels, `json` at the
interpreter's recursion limit) meets a value it cannot write. `dumps_checked` is the same bound on the
way out, for a large body whose parts are written one by one (a Message Batch's requests): each part is
checked as it is written, instead of walking the whole body once more after reading it."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


_LONG_RUN = 20  # 2**64 has 20 digits
# Every digit made a 9, then a run of 20 nines looked for: two passes in C, about 25x faster than the regex,
# whose search tries `\d` at every byte (60 us for a 2 KB line: most of a Message Batch create's read).
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9" * 10)
_NINES = b"9" * _LONG_RUN
_PIECE = 1 << 20  # a memoryview (a large request read in place) is looked at this much at a time


def _has_long_number(data: bytes | memoryview) -> bool:
    """Whether `data` holds a run of 20 digits or more (an integer orjson would read as a float)."""
    if isinstance(data, bytes):
        return _NINES in data.translate(_DIGITS_AS_NINES)
    step = _PIECE - _LONG_RUN  # pieces overlap, so that a run across two of them is seen
    return any(_NINES in bytes(data[at:at + _PIECE]).translate(_DIGITS_AS_NINES) for at in range(0, len(data), step))


def loads(data: bytes | str) -> Any:
    if isinstance(data, str):
        data = data.encode()
    if not _has_long_number(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # what json accepts and orjson doesn't (NaN): json decides, and words its error
    try:
        return json.loads(data)
    except RecursionError:
        # deeper than the interpreter's stack (orjson stops at 1024 levels): a decode error like any other
        raise ValueError("JSON nested too deeply") from None


def loads_checked(data: bytes | memoryview, max_depth: int | None) -> Any:
    """Untrusted JSON: raises ValueError (with a short reason) for what is not strict JSON (NaN, Infinity,
    1e400, a lone surrogate, invalid UTF-8: orjson refuses them all, where `json` reads the first four)
    or nests deeper than `max_depth` containers (None: orjson's own 1024; the caller writes the value's
    parts with `dumps_checked`). Integers of 20 digits or more are read exactly. A memoryview is read in
    place (a large request of a spooled body, never copied whole on the common path)."""
    value = orjson.loads(data)  # its JSONDecodeError is a ValueError; it stops at 1024 levels by itself
    # Fewer brackets than the bound cannot nest deeper than it: the walk runs only for the rare line
    # with many containers (bytes.count is C, about a GB/s).
    if max_depth is not None and _too_many_brackets(bytes(data), max_depth) and _deeper_than(value, max_depth):
        raise ValueError(f"nested more than {max_depth} levels deep")
    if _has_long_number(data):
        return json.loads(bytes(data))  # orjson has checked the text; `json` keeps the long integers exact
    return value


def dumps_checked(obj: Any, max_depth: int) -> bytes:
    """`obj` written as `dumps` writes it, or ValueError when it nests deeper than `max_depth` containers
    (a bound under orjson's 254, so that only a value past the bound, or with an integer past 64 bits,
    ever leaves orjson's writer)."""
    try:
        data: bytes | None = orjson.dumps(obj)
    except TypeError:  # deeper than orjson writes, or an integer past 64 bits
        data = None
    if data is None or _too_many_brackets(data, max_depth):
        if _deeper_than(obj, max_depth):
            raise ValueError(f"nested more than {max_depth} levels deep")
        if data is None:
            data = dumps(obj)  # within the bound: an integer past 64 bits, which `dumps` writes with `json`
    return data


def _too_many_brackets(data: bytes, limit: int) -> bool:
    return data.count(b"[") + data.count(b"{") > limit


def _deeper_than(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:  # a loop, not recursion: the depth is what is being checked
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


__all__ = ["dumps", "dumps_checked", "loads", "loads_checked"]
