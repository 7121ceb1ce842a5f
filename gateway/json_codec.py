"""JSON for the per-request hot path (journal, shard files, merge): orjson, with the standard library
behind it where orjson would be wrong, so nothing a provider or a user sent is changed by the faster
codec: orjson refuses to write integers past 64 bits and non-string keys, and reads such integers as
floats, so a text with a run of 20 digits or more is read by `json`. Output is compact, as the merged
files always were."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


_LONG_NUMBER = re.compile(rb"\d{20}")  # 2**64 has 20 digits


def loads(data: bytes | str) -> Any:
    if isinstance(data, str):
        data = data.encode()
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # what json accepts and orjson doesn't (NaN): json decides, and words its error
    return json.loads(data)


__all__ = ["dumps", "loads"]
