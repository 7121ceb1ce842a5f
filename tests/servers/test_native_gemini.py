"""The Gemini API's two input forms: inline requests and a JSONL file uploaded through the Files API, against the
Gemini stand-in (tests/fakes/stubs_gemini.py, written from Google's Batch Mode and Files references). Nothing is
mocked. (The inline form's translation, errors, failed jobs, cancel and restart are in test_native_providers.py.)

The spec: a part whose inline body would pass `native_inline_max_bytes` (default: Google's 20 MB) is uploaded as a
file of `{key, request}` lines and its results read from the `responsesFile` Google writes, a smaller one goes
inline, both in one shard; the input and responses files are deleted once read (or kept, as configured); a line's
error and a failed job in the file form; cancel; a restart mid-poll; a crash between the upload and the
recording of the batch, found again by its input file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.routes import Route
from gateway.config.schema import parse_config
from gateway.errors import ConfigError
from gateway.store.sqlite.store import SQLiteStore
from providers.native.openai_format import shard_meta_key
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.stub_process import Stub, start_stub
from tests.servers.test_native import ROUTE, cancelled_mid_poll, content, new_shard, run_shard, upstream_ids
from tests.servers.test_native_providers import chat, upstream_status
from tests.support.native_config import native_route

MODEL = "gemini-2.5-flash-lite"


@pytest.fixture(scope="module")
def gemini() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_gemini", ["--batch-delay", "0.3"]) as stub:
        yield stub


@pytest.fixture
def slow_gemini() -> Iterator[Stub]:
    """Batches long enough to cancel or restart."""
    with start_stub("tests.fakes.stubs_gemini", ["--batch-delay", "6"]) as stub:
        yield stub


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, **info: Any) -> Route:
    return native_route({"model": f"gemini/{MODEL}", "api_base": stub.url, "api_key": "g-key"}, **info)


def counts(stub: Stub) -> dict[str, int]:
    stats = stub.stats()
    return {k: int(stats.get(k, 0)) for k in ("inline_batches", "file_batches", "files_uploaded", "files_deleted")}


async def test_a_part_over_the_inline_bound_goes_as_a_file_and_a_smaller_one_inline(
    gemini: Stub, store: SQLiteStore
) -> None:
    """Three parts of three lines (the route's `native_max_lines`): the two whose lines are long pass the 2,000-byte
    inline bound and go as files, the short one inline; every answer comes back in OpenAI's shape, the files gone."""
    backend = NativeBatchBackend(route(gemini, native_max_lines=3, native_inline_max_bytes=2000), {}, store)
    long = "long " * 150  # ~750 bytes a line: three of them pass 2,000
    requests = [chat(i, f"{long}number {i}" if i <= 6 else None) for i in range(1, 10)]
    requests[3].body["messages"][1]["content"] = "long #fail:RESOURCE_EXHAUSTED " + long  # an error line in a file
    shard = await new_shard(store, len(requests))
    before = counts(gemini)
    results = await run_shard(backend, shard, requests)
    after = counts(gemini)
    assert {k: after[k] - before[k] for k in after} == {"inline_batches": 1, "file_batches": 2, "files_uploaded": 2,
                                                        "files_deleted": 4}  # both inputs, both responses files
    assert gemini.stats()["files"] == []
    for req, res in zip(requests, results, strict=True):
        if req.line == 4:
            assert res.status_code == 429 and res.body is not None, res
            assert res.body["error"]["code"] == "RESOURCE_EXHAUSTED" and "directive" in res.body["error"]["message"]
            continue
        assert (res.custom_id, res.status_code) == (req.custom_id, 200)
        assert content(res) == f"echo: {req.body['messages'][1]['content']}".rstrip()
        assert res.body is not None and res.body["object"] == "chat.completion" and res.body["model"] == MODEL
        assert res.usage.input_tokens == 2 + len(req.body["messages"][1]["content"].split())
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert len(summary["upstream_batch_ids"]) == 3 and summary["input_tokens"] > 0


async def test_file_input_keeps_its_files_when_told_and_a_failed_batch_fails_every_line(
    gemini: Stub, store: SQLiteStore
) -> None:
    kept = NativeBatchBackend(route(gemini, native_inline_max_bytes=0, native_keep_files=True), {}, store)
    before = counts(gemini)
    results = await run_shard(kept, await new_shard(store, 2), [chat(1), chat(2)])
    assert all(r.ok for r in results) and counts(gemini)["files_deleted"] == before["files_deleted"]
    assert len(gemini.stats()["files"]) == 2  # the input and the responses file
    gemini.reset()

    failing = NativeBatchBackend(route(gemini, native_inline_max_bytes=0), {}, store)
    results = await run_shard(failing, await new_shard(store, 3), [chat(1), chat(2, "poison #batch:fail"), chat(3)])
    for res in results:
        assert res.error is not None and res.error["code"] == "upstream_batch_failed", res
        assert "Batch failed (#batch:fail directive)." in res.error["message"]
    assert counts(gemini)["file_batches"] == 1 and gemini.stats()["files"] == []  # the input deleted all the same


async def test_cancel_cancels_a_file_batch(slow_gemini: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(slow_gemini, native_inline_max_bytes=0), {}, store)
    (batch_id,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_gemini.stats()["cancels"] == 1 and counts(slow_gemini)["file_batches"] == 1
    assert upstream_status("gemini", slow_gemini, batch_id) == "BATCH_STATE_CANCELLED"


@pytest.mark.parametrize("lost", [False, True], ids=["recorded", "lost-before-recording"])
async def test_restart_polls_the_file_batch_it_created(slow_gemini: Stub, tmp_path: Path, lost: bool) -> None:
    """A shutdown mid-poll: the restart polls the recorded batch. `lost`: the process died between Google's reply
    to the create and the store's write (the uploaded file is recorded, the batch is not): the restart finds the
    batch by its input file among the listed batches and polls it. Either way no second upload, no second batch."""
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_gemini, native_inline_max_bytes=0), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (batch_id,) = await upstream_ids(first_store, shard)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if lost:
        meta = await first_store.backend_state.get(shard_meta_key(shard))
        assert meta is not None and str(meta["parts"][0]["file_id"]).startswith("files/")
        meta["parts"][0]["batch_id"] = None
        await first_store.backend_state.put(shard_meta_key(shard), meta)
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_gemini, native_inline_max_bytes=0), {}, second_store)
        results = await run_shard(second, shard, requests)
        assert counts(slow_gemini) == {"inline_batches": 0, "file_batches": 1, "files_uploaded": 1,
                                       "files_deleted": 2}, "a restart must not upload or create again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [batch_id]
    finally:
        await second_store.aclose()


@pytest.mark.parametrize(("model", "info", "words"), [
    (f"gemini/{MODEL}", {"native_inline_max_bytes": 20_000_001}, "less than or equal to 20000000"),
    ("anthropic/claude-haiku-4-5", {"native_inline_max_bytes": 1000}, "native_inline_max_bytes: not a setting"),
    (f"gemini/{MODEL}", {"native_gcs_bucket": "b"}, "native_gcs_bucket: not a setting"),
])
def test_config_takes_the_inline_bound_on_gemini_only_and_up_to_googles(model: str, info: dict[str, Any],
                                                                        words: str) -> None:
    raw = {"model_list": [{"model_name": "gemini-bulk", "litellm_params": {"model": model},
                           "model_info": {"batch_mode": "native", **info}}]}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "bulk.yaml")
    assert words in str(refused.value), refused.value
