"""Holding a lease for the length of a block, renewed while held: both `Coordination`s use it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

log = logging.getLogger("batchyard.leases")


class Renewable(Protocol):
    ttl: float

    async def acquire(self, what: str, ttl: float | None = None) -> bool: ...
    async def renew(self, what: str) -> None: ...
    async def release(self, what: str) -> None: ...


async def _keep(leases: Renewable, what: str) -> None:
    while True:
        await asyncio.sleep(leases.ttl / 3)
        try:
            await leases.renew(what)
        except Exception as exc:  # the store away for a moment: the next round tries again
            log.warning("could not renew lease %s: %s", what, exc)


@contextlib.asynccontextmanager
async def hold(leases: Renewable, what: str) -> AsyncIterator[bool]:
    """Yields True while the lease `what` is ours (renewed every ttl/3), False if another holds it."""
    if not await leases.acquire(what):
        yield False
        return
    keeper = asyncio.create_task(_keep(leases, what), name=f"lease-{what}")
    try:
        yield True
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        with contextlib.suppress(Exception):
            await leases.release(what)


__all__ = ["Renewable", "hold"]
