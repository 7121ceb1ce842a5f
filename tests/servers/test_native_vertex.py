"""Native batches on Vertex AI: batch prediction jobs over gcp-storage-emulator (a real Cloud Storage server) and
the Vertex stand-in (tests/fakes/stubs_vertex.py), authenticated by a service account's key file whose token
endpoint is the stand-in's (google-auth refreshes it, through LiteLLM's VertexBase). Nothing is mocked.

The spec: rows in GCS as `{"request": GenerateContentRequest}` (LiteLLM's Vertex translation, each row's input
line in its `labels`), one job per part, results back as `chat.completion`s with usage at the batch rate from
predictions.jsonl (in whatever order Google writes it), inputs and outputs gone from the bucket afterwards (or
kept, as configured); an unmappable line's 400; a row's error; a failed or expired job; cancel; a restart that
polls its job.
"""

from __future__ import annotations

import asyncio
import json
import os
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
from tests.servers.test_native_providers import chat
from tests.support.gcs import GcsEmulator, service_account_json, service_account_key
from tests.support.native_config import VERTEX_PROJECT as PROJECT
from tests.support.native_config import native_route

MODEL = "gemini-2.5-flash"


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    emulator = GcsEmulator().start()
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
    try:
        yield emulator
    finally:
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
        emulator.close()


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return service_account_key(tmp_path_factory.mktemp("sa"))


def _vertex(gcs: GcsEmulator, key_pair: tuple[str, Path], delay: str) -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_vertex", ["--batch-delay", delay, "--gcs-endpoint", gcs.url,
                                                   "--public-key", str(key_pair[1])])
    stub.key = key_pair[0]  # type: ignore[attr-defined]
    yield stub
    stub.stop()


@pytest.fixture
def vertex(gcs: GcsEmulator, key_pair: tuple[str, Path]) -> Iterator[Stub]:
    yield from _vertex(gcs, key_pair, "0.3")


@pytest.fixture
def slow_vertex(gcs: GcsEmulator, key_pair: tuple[str, Path]) -> Iterator[Stub]:
    """Jobs long enough to cancel or restart."""
    yield from _vertex(gcs, key_pair, "6")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def credentials(stub: Stub) -> str:
    return service_account_json(stub.key, f"{stub.url}/token", PROJECT)  # type: ignore[attr-defined]


def route(stub: Stub, gcs: GcsEmulator, **info: Any) -> Route:
    params = {"model": f"vertex_ai/{MODEL}", "api_base": stub.url, "vertex_project": PROJECT,
              "vertex_location": "us-central1", "vertex_credentials": credentials(stub)}
    return native_route(params, native_gcs_bucket=gcs.bucket, **info)


async def test_a_job_of_rows_in_gcs_answers_at_the_batch_rate_and_leaves_the_bucket_empty(
    vertex: Stub, gcs: GcsEmulator, store: SQLiteStore
) -> None:
    import litellm

    backend = NativeBatchBackend(route(vertex, gcs), {}, store)
    requests = [chat(i) for i in range(1, 31)]
    shard = await new_shard(store, len(requests))
    results = await run_shard(backend, shard, requests)
    stats = vertex.stats()
    assert stats["batches_created"] == 1 and stats["batch_requests"] == 30 and stats["tokens"] >= 1
    sent = stats["inputs_seen"][0]  # LiteLLM's Vertex body: the system prompt apart, the line in a label
    assert [c["role"] for c in sent["contents"]] == ["user"] and "Answer briefly." in json.dumps(sent.get(
        "systemInstruction", sent.get("system_instruction")))
    assert sent["labels"] == {"batchyard_line": "l1"}
    for req, res in zip(requests, results, strict=True):  # the stand-in answers in reverse order
        assert (res.custom_id, res.status_code) == (req.custom_id, 200)
        assert content(res) == f"echo: hello number {req.line}" and res.body is not None
        assert res.body["object"] == "chat.completion"
        assert (res.usage.input_tokens, res.usage.output_tokens) == (5, 4)
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert summary["upstream_batch_ids"] == await upstream_ids(store, shard)
    assert summary["upstream_batch_ids"][0].startswith(f"projects/{PROJECT}/locations/us-central1/batchPrediction")
    price = litellm.model_cost[MODEL]  # the map's *_batches prices
    assert summary["cost_usd"] == pytest.approx(30 * (5 * price["input_cost_per_token_batches"]
                                                      + 4 * price["output_cost_per_token_batches"]))
    assert gcs.object_names() == []  # the input and predictions.jsonl deleted with the batch


async def test_keep_files_keeps_them_a_row_error_keeps_its_code_and_an_unmappable_line_is_refused(
    vertex: Stub, gcs: GcsEmulator, store: SQLiteStore
) -> None:
    backend = NativeBatchBackend(route(vertex, gcs, native_keep_files=True, native_gcs_prefix="kept"), {}, store)
    requests = [chat(i, "busy #fail:429" if i == 3 else None) for i in range(1, 6)]
    requests.append(chat(6, logit_bias={"50256": -100}))
    results = await run_shard(backend, await new_shard(store, 6), requests)
    failed = results[2]
    assert failed.status_code == 429 and failed.body is not None and failed.body["error"]["code"] == "429"
    assert all(r.ok for r in results if r.line not in (3, 6))
    refused = results[5]  # unmappable: its 400, never sent
    assert refused.status_code == 400 and refused.body is not None
    assert refused.body["error"]["code"] == "unsupported_parameter" and refused.body["error"]["param"] == "logit_bias"
    assert vertex.stats()["batch_requests"] == 5
    keys = gcs.object_names()
    assert any(k.startswith("kept/input/") for k in keys) and any(k.endswith("/predictions.jsonl") for k in keys)


@pytest.mark.parametrize(("directive", "code"), [("#batch:fail", "upstream_batch_failed"),
                                                  ("#batch:expire", "batch_expired")])
async def test_a_failed_or_expired_job_fails_every_line(directive: str, code: str, vertex: Stub, gcs: GcsEmulator,
                                                        store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(vertex, gcs, native_gcs_prefix=f"f{code}"), {}, store)
    requests = [chat(i, f"poison {directive}" if i == 2 else None) for i in range(1, 5)]
    results = await run_shard(backend, await new_shard(store, 4), requests)
    for res in results:
        assert res.status_code is None and res.error is not None and res.error["code"] == code, res
    assert not any(k.startswith(f"f{code}/") for k in gcs.object_names())  # the input is gone all the same


async def test_cancel_cancels_the_job(slow_vertex: Stub, gcs: GcsEmulator, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(slow_vertex, gcs), {}, store)
    (job,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_vertex.stats()["cancels"] == 1 and "/batchPredictionJobs/" in job


async def test_restart_polls_the_job_it_created(slow_vertex: Stub, gcs: GcsEmulator, tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_vertex, gcs), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (job,) = await upstream_ids(first_store, shard)
    task.cancel()  # a shutdown mid-poll
    with pytest.raises(asyncio.CancelledError):
        await task
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_vertex, gcs), {}, second_store)
        results = await run_shard(second, shard, requests[1:])
        assert slow_vertex.stats()["batches_created"] == 1, "a restart must not create the job again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [job]
    finally:
        await second_store.aclose()


async def test_a_job_created_but_not_recorded_before_a_crash_is_found_by_its_display_name(
        slow_vertex: Stub, gcs: GcsEmulator, tmp_path: Path) -> None:
    """A crash between Vertex's reply to the create and the store's write: the input's object is recorded, the
    job is not. The restart lists the jobs by the input's display name and polls that one."""
    path = tmp_path / "crash.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_vertex, gcs), {}, first_store)
    requests = [chat(i) for i in range(1, 4)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (job,) = await upstream_ids(first_store, shard)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    meta = await first_store.backend_state.get(shard_meta_key(shard))
    assert meta is not None and meta["parts"][0]["file_id"]
    meta["parts"][0]["batch_id"] = None  # as if the process died before recording the job
    await first_store.backend_state.put(shard_meta_key(shard), meta)
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_vertex, gcs), {}, second_store)
        results = await run_shard(second, shard, requests)
        assert slow_vertex.stats()["batches_created"] == 1, "the job was found, not made again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [job]
    finally:
        await second_store.aclose()


@pytest.mark.parametrize(("model", "info", "words"), [
    (f"vertex_ai/{MODEL}", {}, "needs native_gcs_bucket"),
    (f"vertex_ai/{MODEL}", {"native_gcs_bucket": "b", "native_s3_prefix": "x"}, "native_s3_prefix: not a setting"),
    ("gemini/gemini-2.5-flash", {"native_gcs_bucket": "b"}, "native_gcs_bucket: not a setting"),
    ("vertex_ai/claude-sonnet-4@20250514", {"native_gcs_bucket": "b"}, "gemini-* models only"),
])
def test_config_refuses_a_vertex_route_without_its_bucket_and_stray_storage_keys(
        model: str, info: dict[str, Any], words: str) -> None:
    raw = {"model_list": [{"model_name": "gemini-bulk", "litellm_params": {"model": model},
                           "model_info": {"batch_mode": "native", **info}}]}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "bulk.yaml")
    assert words in str(refused.value), refused.value
