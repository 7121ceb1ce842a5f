"""Running a coroutine from a plain (sync) test without touching the test session's event loop.

`asyncio.run` in the main thread leaves it with no current event loop when it returns, and every async test
that comes after it in the same pytest process (they share one session loop: pyproject's
`asyncio_default_fixture_loop_scope`) then fails with "There is no current event loop". `run_apart` runs the
coroutine in a thread of its own, as another process of the deployment would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_apart(coro: Coroutine[Any, Any, T]) -> T:
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="run-apart") as pool:
        return pool.submit(asyncio.run, coro).result()


__all__ = ["run_apart"]
