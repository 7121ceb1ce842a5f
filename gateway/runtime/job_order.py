"""The order in which the validation processes take their jobs: a caller's first.

A `ProcessPoolExecutor` runs what it was handed in the order it was handed. A burst of creates queues one plan
per batch there, and a job whose caller waits for its answer (a reserving create's estimate, a file's
`cost_estimate`, a Message Batch body's read) would wait behind all of them: each create then took as long as
every plan before it. So no more jobs than there are processes are handed to the pool at once, and a free
process goes to a waiting caller's job before any plan; plans keep their own order, and a batch waits for its
plan anyway (it is `validating` until then).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class JobOrder:
    """`slot(urgent)`: one of `slots` places in the pool, held while a job runs; urgent jobs are let in first."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        # the jobs waiting for a place, the urgent ones first: each a future set when it is given one
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    @contextlib.asynccontextmanager
    async def slot(self, urgent: bool) -> AsyncIterator[None]:
        await self._take(urgent)
        try:
            yield
        finally:
            self._give()

    async def _take(self, urgent: bool) -> None:
        queue = self._waiting[0 if urgent else 1]
        if self._free and not self._waiting[0] and (urgent or not queue):
            self._free -= 1
            return
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(place)
        try:
            await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():  # given a place as the caller left: the next job takes it
                self._give()
            with contextlib.suppress(ValueError):
                queue.remove(place)
            raise

    def _give(self) -> None:
        """A place is free: to the first waiting job (a caller's before a plan), else back to the pool."""
        for queue in self._waiting:
            while queue:
                place = queue.popleft()
                if not place.done():
                    place.set_result(None)
                    return
        self._free += 1
