"""xAI's Batch API (`xai/`) against its stand-in (tests/fakes/stubs_xai.py, written from xAI's batch guide: the
purpose-less upload, the named batch over an input file, counters rather than a status, results paged by
`pagination_token`, `:cancel`, the paged list). Nothing is mocked.

The spec every provider has: a shard split under the job limit answered in OpenAI's shape at batch prices (the
results read page by page); a line's error; a batch xAI refuses; cancel; a restart mid-poll, and a crash between
the upload and the recording of the batch, found again by its input file in the paged list.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.routes import Route
from gateway.store.sqlite.store import SQLiteStore
from providers.native.openai_format import shard_meta_key
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.stub_process import Stub, start_stub
from tests.servers.test_native import ROUTE, cancelled_mid_poll, content, new_shard, run_shard, upstream_ids
from tests.servers.test_native_providers import chat
from tests.support.native_config import native_route

MODEL = "grok-3-mini"


@pytest.fixture(scope="module")
def xai() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_xai", ["--batch-delay", "0.3", "--max-page", "2", "--api-key", "x-key"]) as s:
        yield s


@pytest.fixture
def slow_xai() -> Iterator[Stub]:
    """Batches long enough to cancel or restart; one batch a page in the list, so a restart pages through it."""
    with start_stub("tests.fakes.stubs_xai", ["--batch-delay", "6", "--max-page", "1"]) as stub:
        yield stub


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, **info: Any) -> Route:
    return native_route({"model": f"xai/{MODEL}", "api_base": f"{stub.url}/v1", "api_key": "x-key"},
                        input_cost_per_token=3e-7, output_cost_per_token=5e-7, **info)


async def test_a_shard_split_under_the_job_limit_answers_in_openai_shape_paged_at_batch_prices(
    xai: Stub, store: SQLiteStore
) -> None:
    """Two batches of up to 4 lines, each read back two results a page; a line xAI failed carries its code."""
    backend = NativeBatchBackend(route(xai, native_max_lines=4), {}, store)
    requests = [chat(i) for i in range(1, 8)] + [chat(8, "please #fail:429 now")]
    shard = await new_shard(store, len(requests))
    before = xai.stats()
    results = await run_shard(backend, shard, requests)
    after = xai.stats()
    assert after["batches_created"] - before.get("batches_created", 0) == 2
    assert after["result_pages"] - before.get("result_pages", 0) >= 4  # 4 results a batch, 2 a page
    for req, res in zip(requests[:-1], results[:-1], strict=True):
        assert (res.custom_id, res.status_code, res.model) == (req.custom_id, 200, ROUTE), res
        assert content(res) == f"echo: hello number {req.line}"
        assert res.cost_usd == pytest.approx(res.usage.input_tokens * 1.5e-7 + res.usage.output_tokens * 2.5e-7)
    failed = results[-1]
    assert failed.error is not None and failed.error["code"] == "429" and "directive" in failed.error["message"]
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert len(summary["upstream_batch_ids"]) == 2
    billed = (after["billed_input_tokens"] - before.get("billed_input_tokens", 0),
              after["billed_output_tokens"] - before.get("billed_output_tokens", 0))
    assert (summary["input_tokens"], summary["output_tokens"]) == billed


async def test_a_batch_xai_refuses_fails_every_line_with_its_reason(xai: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(xai), {}, store)
    results = await run_shard(backend, await new_shard(store, 2), [chat(1), chat(2, "x #batch:unreadable")])
    for res in results:
        assert res.error is not None and res.error["code"] == "upstream_batch_failed", res
        assert "could not be read (#batch:unreadable directive)" in res.error["message"]


async def test_cancel_cancels_the_batch(slow_xai: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(slow_xai), {}, store)
    (batch_id,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_xai.stats()["cancels"] == 1 and batch_id.startswith("batch_")


@pytest.mark.parametrize("lost", [False, True], ids=["recorded", "lost-before-recording"])
async def test_restart_polls_the_batch_it_created(slow_xai: Stub, tmp_path: Path, lost: bool) -> None:
    """A shutdown mid-poll: the restart polls the recorded batch. `lost`: the process died between xAI's reply to
    the create and the store's write: the restart pages through xAI's list (one batch a page here, behind a batch
    made after it) to find it by its input file. No second upload, no second batch."""
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_xai), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (batch_id,) = await upstream_ids(first_store, shard)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if lost:
        meta = await first_store.backend_state.get(shard_meta_key(shard))
        assert meta is not None and str(meta["parts"][0]["file_id"]).startswith("file_")
        meta["parts"][0]["batch_id"] = None
        await first_store.backend_state.put(shard_meta_key(shard), meta)
        other = NativeBatchBackend(route(slow_xai), {}, first_store)  # a newer batch, listed first
        other_shard = await new_shard(first_store, 1)
        other_task = asyncio.create_task(anext(other.execute_shard(other_shard, [chat(9)])))
        await upstream_ids(first_store, other_shard)
        other_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other_task
    await first_store.aclose()
    created = slow_xai.stats()["batches_created"]
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_xai), {}, second_store)
        results = await run_shard(second, shard, requests)
        assert slow_xai.stats()["batches_created"] == created, "a restart must not create again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [batch_id]
    finally:
        await second_store.aclose()
