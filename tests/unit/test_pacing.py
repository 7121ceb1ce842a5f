"""Pacing in `run_bounded`, in one process over a real embedded store (SQLite rate windows of 1 s): a paced
shard's requests start at most `rpm` a window and hold no request slot while they wait, so an unpaced shard
on the same slots goes at full speed; a budget's `stop_sending` ends a paced shard that is waiting for its
window; tpm reserves an estimate per request and corrects it by the tokens the results report."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.backends.bounded import run_bounded
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.scheduling.fairness import FairSlots, Share, running_for, stop_sending
from gateway.scheduling.pacing import Pacer, pacing_with
from gateway.store.sqlite.store import SQLiteStore


def _requests(n: int, model: str = "m") -> list[BatchRequest]:
    return [BatchRequest(i, f"c{i}", Endpoint.CHAT, {"model": model, "messages": [{"role": "user", "content": "hi"}]})
            for i in range(1, n + 1)]


class Upstream:
    """Answers each request after `latency` s with 3 + 4 tokens, noting when each started (by window)."""

    def __init__(self, latency: float = 0.02) -> None:
        self.latency, self.started = latency, Counter[int]()

    async def call(self, req: BatchRequest) -> Result:
        self.started[int(time.time())] += 1
        await asyncio.sleep(self.latency)
        body = {"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
        return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=body, model=req.model)


@contextlib.asynccontextmanager
async def _store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "p.sqlite3", rate_window_seconds=1)
    try:
        yield store
    finally:
        await store.aclose()


async def _run(requests: list[BatchRequest], upstream: Upstream, slots: FairSlots, share: Share,
               pacer: Pacer | None) -> list[Result]:
    with running_for(share), pacing_with(pacer):
        return [r async for r in run_bounded(requests, upstream.call, slots)]


async def _window_start() -> None:
    await asyncio.sleep(1.01 - time.time() % 1)


async def test_rpm_paces_a_shard_and_holds_no_slot_while_it_waits(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        slots, paced_up, free_up = FairSlots(4), Upstream(), Upstream()
        pacer = Pacer(store.rates, "paced", "m", rpm=3, tpm=None)
        await _window_start()
        began = time.monotonic()
        paced = asyncio.create_task(_run(_requests(9), paced_up, slots, Share("paced", "b1"), pacer))
        await asyncio.sleep(0.2)
        free = await _run(_requests(40), free_up, slots, Share("free", "b2"), None)
        assert len(free) == 40 and time.monotonic() - began < 1.0  # not behind the paced shard's windows
        results = await paced
        assert sorted(r.line for r in results) == list(range(1, 10))
        assert sorted(paced_up.started.values()) == [3, 3, 3], paced_up.started  # 3 a window, 3 windows
        assert slots.used == 0
        assert await store.rates.used("paced", "m") in ((0, 0), (3, 0))  # the last window (or the next, empty)


async def test_stop_sending_ends_a_paced_shard_waiting_for_its_window(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        slots, up = FairSlots(4), Upstream()
        await _window_start()
        run = asyncio.create_task(_run(_requests(10), up, slots, Share("t", "b3"),
                                       Pacer(store.rates, "t", "m", rpm=2, tpm=None)))
        await asyncio.sleep(0.3)  # 2 started and back; the rest wait for the next window
        stop_sending("b3")
        results = await asyncio.wait_for(run, 2)
        assert len(results) == 2 and sum(up.started.values()) == 2


async def test_tpm_reserves_an_estimate_and_counts_what_results_report(tmp_path: Path) -> None:
    async with _store(tmp_path) as store:
        slots, up = FairSlots(8), Upstream()
        pacer = Pacer(store.rates, "t", "m", rpm=None, tpm=21)  # 7 tokens a request: 3 a window
        await _window_start()
        results = await _run(_requests(9), up, slots, Share("t", "b4"), pacer)
        await pacer.flush()
        assert len(results) == 9
        # The first window's estimate is the body's size / 4 (more than 7): fewer then, 3 a window after.
        assert max(up.started.values()) <= 3 and len(up.started) >= 3, up.started
        assert pacer.estimate(None) == 7  # learned from the results
