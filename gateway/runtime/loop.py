"""The event loop every batchyard process runs on: uvloop when it is installed, with one exception handler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# aiohttp (under aiobotocore's S3 client) sends a request's headers and body in a task of its own. When the peer
# closes the connection as they are sent (an S3 that refuses, a reset), the request fails on its own path, which
# the store's retries and the S3 outage pause handle; but that task's ConnectionResetError is never retrieved,
# and asyncio would log it at ERROR with a traceback (seen once in a fresh-clone run of test_faults_s3.py).
_CUT_WRITES = frozenset({"ClientRequest.write_bytes"})


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    else:
        new_loop = uvloop.new_event_loop

    def make() -> asyncio.AbstractEventLoop:
        loop = new_loop()
        loop.set_exception_handler(handle_exception)
        return loop

    return make


def handle_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler, except for a write task of aiohttp's cut off by its peer: one line at WARNING."""
    exc, task = context.get("exception"), context.get("future")
    if isinstance(exc, ConnectionResetError) and isinstance(task, asyncio.Task):
        name = getattr(task.get_coro(), "__qualname__", "")
        if name in _CUT_WRITES:
            log.warning("%s was cut off by its peer (%s); its request failed on its own path", name, exc)
            return
    loop.default_exception_handler(context)
