"""The event loop every batchyard process runs on (`gateway.runtime.loop`).

aiohttp writes a request in a task of its own; when the peer closes the connection as it writes, the request
fails on its own path and that task's ConnectionResetError is never retrieved. Our loops log it as one
warning line, not asyncio's ERROR and traceback; any other unretrieved exception keeps asyncio's report.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import ClientRequest
from aiohttp.client_exceptions import ClientConnectionResetError

from gateway.runtime.loop import loop_factory


async def _other() -> None:
    await asyncio.sleep(0)


def _report(caplog: pytest.LogCaptureFixture, coro_of: str) -> list[logging.LogRecord]:
    loop = loop_factory()()
    try:
        # a real aiohttp write task (unstarted: only its coroutine is looked at), or any other task
        coro = ClientRequest.write_bytes(None, None, None) if coro_of == "aiohttp" else _other()  # type: ignore[arg-type]
        task = loop.create_task(coro)
        task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        caplog.clear()
        loop.call_exception_handler({"message": "Task exception was never retrieved", "future": task,
                                     "exception": ClientConnectionResetError("Cannot write to closing transport")})
        return list(caplog.records)
    finally:
        loop.close()


def test_an_aiohttp_write_cut_off_by_its_peer_is_one_warning_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    [record] = _report(caplog, "aiohttp")
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "ClientRequest.write_bytes was cut off by its peer" in record.getMessage()


def test_any_other_unretrieved_exception_keeps_asyncios_error(caplog: pytest.LogCaptureFixture) -> None:
    [record] = _report(caplog, "other")
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "Task exception was never retrieved" in record.getMessage()
