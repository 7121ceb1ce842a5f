"""Groq's native batches (`groq/`), and any host of OpenAI's Batch API as an `openai/` deployment with its own
`api_base`, against the Groq stand-in (tests/fakes/stubs_groq.py, written from Groq's Batch reference: OpenAI's
API under `/openai/v1`, chat only, windows from 24h to 7d, a batch list without paging parameters). Nothing is
mocked.

The spec: a shard split under the job limit, answered in OpenAI's shape at the configured batch prices, with the
configured completion window; a line's error; a failed job; cancel; a restart mid-poll that polls the job it
made (both kinds of deployment); a crash between the upload and the recording of the job, found again in the
host's list without OpenAI's paging parameters; the config's refusals (a window Groq does not take, a key of
another provider, an unpriced route for a team with a budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.routes import Route
from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.errors import ConfigError
from gateway.store.sqlite.store import SQLiteStore
from providers.native.openai_format import shard_meta_key
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.stub_process import Stub, start_stub
from tests.servers.test_native import ROUTE, cancelled_mid_poll, content, new_shard, run_shard, upstream_ids
from tests.servers.test_native_providers import chat, stub_get
from tests.support.native_config import native_route

MODEL = "llama-3.1-8b-instant"
KEY = "gsk-test"
PRICES = {"input_cost_per_token_batches": 2.5e-8, "output_cost_per_token_batches": 4e-8}


@pytest.fixture(scope="module")
def groq() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_groq", ["--batch-delay", "0.3", "--api-key", KEY]) as stub:
        yield stub


@pytest.fixture
def slow_groq() -> Iterator[Stub]:
    """Batches long enough to cancel or restart."""
    with start_stub("tests.fakes.stubs_groq", ["--batch-delay", "6", "--api-key", KEY]) as stub:
        yield stub


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, provider: str = "groq", **info: Any) -> Route:
    """`groq/` at the stand-in, or an `openai/` deployment whose `api_base` is the stand-in's `/openai/v1`."""
    params = {"model": f"{provider}/{MODEL}", "api_base": f"{stub.url}/openai/v1", "api_key": KEY}
    return native_route(params, **{**PRICES, **info})


def job(stub: Stub, batch_id: str) -> dict[str, Any]:
    return dict(stub_get(stub, f"/openai/v1/batches/{batch_id}", {"Authorization": f"Bearer {KEY}"}))


@pytest.mark.parametrize("provider", ["groq", "openai"])
async def test_shard_split_under_the_job_limit_answers_in_openai_shape_at_batch_rates(
        provider: str, groq: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(groq, provider, native_max_lines=2, native_completion_window="48h"), {},
                                 store)
    requests = [chat(i) for i in range(1, 6)]
    shard = await new_shard(store, len(requests))
    before = groq.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert groq.stats()["batches_created"] - before == 3  # 5 lines, 2 per job
    assert all(r.status_code == 200 and r.custom_id == f"task-{r.line}" for r in results)
    assert content(results[0]) == "echo: hello number 1"
    ids = await upstream_ids(store, shard)
    assert {job(groq, i)["completion_window"] for i in ids} == {"48h"}
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    tokens_in, tokens_out = summary["input_tokens"], summary["output_tokens"]
    assert tokens_in > 0 and tokens_out > 0
    assert summary["cost_usd"] == pytest.approx(tokens_in * 2.5e-8 + tokens_out * 4e-8)


async def test_a_line_error_and_a_failed_job_keep_the_hosts_codes(groq: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(groq), {}, store)
    shard = await new_shard(store, 2)
    results = await run_shard(backend, shard, [chat(1), chat(2, "please #fail:429 now")])
    assert results[0].status_code == 200 and results[1].status_code == 429
    shard = await new_shard(store, 2)
    failed = await run_shard(backend, shard, [chat(1, "#batch:fail"), chat(2)])
    assert all(r.error is not None and r.error["code"] == "upstream_batch_failed" for r in failed)


async def test_an_endpoint_groq_batches_lack_is_that_lines_400(groq: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(groq), {}, store)
    embed = BatchRequest(line=2, custom_id="task-2", url=Endpoint.EMBEDDINGS, body={"model": ROUTE, "input": "x"})
    shard = await new_shard(store, 2)
    results = await run_shard(backend, shard, [chat(1), embed])
    assert results[0].status_code == 200
    assert results[1].status_code == 400 and results[1].body is not None
    error = results[1].body["error"]
    assert error["code"] == "unsupported_endpoint" and "groq batches" in error["message"]


async def test_cancel_cancels_groqs_job(slow_groq: Stub, store: SQLiteStore) -> None:
    (batch_id,), _ = await cancelled_mid_poll(NativeBatchBackend(route(slow_groq), {}, store), store, [chat(1)])
    await asyncio.sleep(0.3)
    assert job(slow_groq, batch_id)["status"] in ("cancelling", "cancelled")


@pytest.mark.parametrize("provider", ["groq", "openai"])
async def test_a_restart_mid_job_polls_the_job_it_made(provider: str, slow_groq: Stub, tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_groq, provider), {}, first_store)
    await first.start()
    requests = [chat(i) for i in range(1, 4)]
    shard = await new_shard(first_store, len(requests))

    async def first_result() -> Result:
        return await anext(first.execute_shard(shard, requests))

    task = asyncio.create_task(first_result())
    (batch_id,) = await upstream_ids(first_store, shard)
    created = slow_groq.stats()["batches_created"]
    task.cancel()  # the gateway goes away mid-poll; its job runs on
    with pytest.raises(asyncio.CancelledError):
        await task
    await first.aclose()
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_groq, provider), {}, second_store)
        results = await run_shard(second, shard, requests)
        assert slow_groq.stats()["batches_created"] == created, "a restart must not create the job again"
        assert all(r.status_code == 200 for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [batch_id]
    finally:
        await second_store.aclose()


@pytest.mark.parametrize("provider", ["groq", "openai"])
async def test_a_job_made_before_a_crash_is_found_in_the_hosts_list(provider: str, groq: Stub,
                                                                    store: SQLiteStore) -> None:
    """The upload was recorded, the job created, the process died before recording it: the restart finds it in
    the host's list, asked as the host takes it (the stand-in refuses OpenAI's `limit` and `after`)."""
    import litellm

    backend = NativeBatchBackend(route(groq, provider), {}, store)
    await backend.start()
    requests = [chat(1), chat(2)]
    shard = await new_shard(store, 2)
    jobs, _, _ = backend._deployment(0)
    assert jobs is not None
    kwargs = {"custom_llm_provider": "openai", "api_base": f"{groq.url}/openai/v1", "api_key": KEY}
    upload = await litellm.acreate_file(file=("in.jsonl", b"".join(jobs.line(r) for r in requests)),
                                        purpose="batch", **kwargs)
    made = await litellm.acreate_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                       input_file_id=upload.id, **kwargs)
    await store.backend_state.put(shard_meta_key(shard), {"deployment": 0, "parts": [
        {"endpoint": "/v1/chat/completions", "lines": [1, 2], "file_id": upload.id}]})
    created = groq.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert groq.stats()["batches_created"] == created
    assert all(r.ok for r in results)
    assert await upstream_ids(store, shard) == [made.id]


def _config(info: dict[str, Any], model: str = f"groq/{MODEL}", teams: str = "") -> None:
    entry = {"model_name": "bulk", "litellm_params": {"model": model, "api_key": KEY},
             "model_info": {"batch_mode": "native", **info}}
    raw: dict[str, Any] = {"model_list": [entry]}
    if teams:
        raw["batch_settings"] = {"teams": [{"team_id": teams, "api_keys": ["sk-team"], "max_budget": 10.0}]}
    parse_config(raw)


@pytest.mark.parametrize("window", ["12h", "8d", "200h"])
def test_the_config_refuses_a_window_groq_does_not_take(window: str) -> None:
    with pytest.raises(ConfigError, match=rf"native_completion_window {window}: groq/ batches take 24h to 168h"):
        _config({"native_completion_window": window})
    _config({"native_completion_window": "7d"})


def test_the_window_is_a_key_of_the_openai_format_hosts_only() -> None:
    with pytest.raises(ConfigError, match=r"native_completion_window: not a setting of a mistral/ deployment"):
        _config({"native_completion_window": "24h"}, model="mistral/mistral-small-latest")
    with pytest.raises(ConfigError, match=r"native_completion_window"):
        _config({"native_completion_window": "24"}, model="openai/gpt-4o-mini")


def test_an_unpriced_groq_route_is_refused_for_a_team_with_a_budget() -> None:
    with pytest.raises(ConfigError, match=r"no batch price .*team 'analysts'"):
        _config({}, teams="analysts")
    _config({}, teams="")  # no budget: nothing to count
    _config(PRICES, teams="analysts")
