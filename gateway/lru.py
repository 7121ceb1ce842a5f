"""`LRU`: a dict with a size bound, for caches keyed by what lines name (a wildcard's concrete models).

A cache keyed by a line's text grows with every new name a team sends; bounded, the least recently used
entry goes first, so a batch of distinct names costs a recomputation, never memory."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `size` entries; `get` marks an entry used, `put` drops the least recently used past the bound."""

    __slots__ = ("_data", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V | None = None) -> V | None:
        try:
            value = self._data[key]
        except KeyError:
            return default
        with contextlib.suppress(KeyError):  # another thread (a plan checks lines in one) dropped it meanwhile
            self._data.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: K, value: V) -> V:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        self._data.clear()


__all__ = ["LRU"]
