"""The two things every server test needs: a free loopback port, and a wait with a deadline.

`eventually(check)` calls `check` until it returns something truthy and returns that; past `timeout`
it fails the test with `what` (and, when given, `detail()`, e.g. a server's log), never hangs.
`eventually_async` is the same for a coroutine function. One home, so that every test polls alike.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (for a server that cannot take an open socket from us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def eventually(check: Callable[[], T], timeout: float = 60, what: str = "a condition", *,
               interval: float = 0.05, detail: Callable[[], str] | None = None) -> T:
    """`check()`'s first truthy value, polled every `interval` seconds for at most `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"\n{detail()}" if detail else ""))
        time.sleep(interval)
    return value


async def eventually_async(check: Callable[[], Awaitable[T]], timeout: float = 60, what: str = "a condition", *,
                           interval: float = 0.05) -> T:
    """The same for a coroutine function: its first truthy result, awaited every `interval` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
    return value


__all__ = ["eventually", "eventually_async", "free_port"]
