"""Fireworks AI's batch inference jobs (`fireworks_ai/`) against its stand-in (tests/fakes/stubs_fireworks.py,
written from Fireworks' reference: a dataset made and uploaded, a job named by its own id over it, `JOB_STATE_*`
states, the output dataset's `BIJOutputSet.jsonl` and `error-data` read from signed URLs, DELETE for cancel).
Nothing is mocked.

The spec every provider has: a shard split under the job limit answered in OpenAI's shape at the batch price; a
line's error; a failed and an expired job; cancel; a restart mid-poll, and a crash between the dataset's upload
and the recording of the job, found again by its id; the config's refusal of a deployment with no account.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
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
from tests.support.native_config import native_route

MODEL = "accounts/fireworks/models/llama-v3p1-8b-instruct"  # LiteLLM's map: 1e-7 a token in real time
BATCH_PRICE = 0.5e-7  # Fireworks' batches: half the serverless price, every model
ACCOUNT = "batchyard-test"


@pytest.fixture(scope="module")
def fireworks() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_fireworks", ["--batch-delay", "0.3", "--api-key", "fw-key"]) as stub:
        yield stub


@pytest.fixture
def slow_fireworks() -> Iterator[Stub]:
    """Jobs long enough to cancel or restart."""
    with start_stub("tests.fakes.stubs_fireworks", ["--batch-delay", "6"]) as stub:
        yield stub


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, **info: Any) -> Route:
    return native_route({"model": f"fireworks_ai/{MODEL}", "api_base": f"{stub.url}/inference/v1",
                         "api_key": "fw-key"}, native_account_id=ACCOUNT, **info)


def job_state(stub: Stub, job_id: str) -> str:
    request = urllib.request.Request(f"{stub.url}/v1/accounts/{ACCOUNT}/batchInferenceJobs/{job_id}",
                                     headers={"Authorization": "Bearer fw-key"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as reply:
        return str(json.loads(reply.read())["state"])


async def test_a_shard_split_under_the_job_limit_answers_in_openai_shape_at_the_batch_price(
    fireworks: Stub, store: SQLiteStore
) -> None:
    """7 lines, 3 a job: 3 datasets and 3 jobs; answered rows (bare chat completions) come back in OpenAI's shape
    at half LiteLLM's real-time price; a row in `error-data` comes back as its error."""
    backend = NativeBatchBackend(route(fireworks, native_max_lines=3), {}, store)
    requests = [chat(i) for i in (2, 3, 5, 8, 9, 11)] + [chat(12, "please #fail:model_error now")]
    shard = await new_shard(store, len(requests))
    before = fireworks.stats()
    results = await run_shard(backend, shard, requests)
    after = fireworks.stats()
    assert after["jobs_created"] - before.get("jobs_created", 0) == 3
    assert after["uploads"] - before.get("uploads", 0) == 3
    for req, res in zip(requests[:-1], results[:-1], strict=True):
        assert (res.custom_id, res.status_code, res.model) == (req.custom_id, 200, ROUTE)
        assert content(res) == f"echo: hello number {req.line}"
        assert res.body is not None and res.body["model"] == MODEL and res.body["object"] == "chat.completion"
        assert res.cost_usd == pytest.approx((res.usage.input_tokens + res.usage.output_tokens) * BATCH_PRICE)
    failed = results[-1]
    assert failed.error is not None and failed.error["code"] == "model_error", failed
    assert "directive" in failed.error["message"]
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert len(summary["upstream_batch_ids"]) == 3
    billed = after["billed_input_tokens"] - before.get("billed_input_tokens", 0), \
        after["billed_output_tokens"] - before.get("billed_output_tokens", 0)
    assert (summary["input_tokens"], summary["output_tokens"]) == billed  # what Fireworks bills, line for line
    assert summary["cost_usd"] == pytest.approx((billed[0] + billed[1]) * BATCH_PRICE)


@pytest.mark.parametrize(("directive", "code", "words"), [
    ("#batch:fail", "upstream_batch_failed", "The job failed (#batch:fail directive)."),
    ("#batch:expire", "batch_expired", "expired before this request ran"),
])
async def test_a_failed_or_expired_job_gives_every_line_its_error(
    fireworks: Stub, store: SQLiteStore, directive: str, code: str, words: str
) -> None:
    backend = NativeBatchBackend(route(fireworks), {}, store)
    results = await run_shard(backend, await new_shard(store, 2), [chat(1), chat(2, f"poison {directive}")])
    for res in results:
        assert res.error is not None and res.error["code"] == code and words in res.error["message"], res


async def test_cancel_deletes_the_job(slow_fireworks: Stub, store: SQLiteStore) -> None:
    """Fireworks has no cancel: DELETE stops the job."""
    backend = NativeBatchBackend(route(slow_fireworks), {}, store)
    (job_id,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_fireworks.stats()["deletes"] == 1
    assert job_state(slow_fireworks, job_id) == "JOB_STATE_DELETING_CLEANING_UP"


@pytest.mark.parametrize("lost", [False, True], ids=["recorded", "lost-before-recording"])
async def test_restart_polls_the_job_it_created(slow_fireworks: Stub, tmp_path: Path, lost: bool) -> None:
    """A shutdown mid-poll: the restart polls the recorded job. `lost`: the process died between Fireworks' reply
    to the create and the store's write: the job has its dataset's id, so the restart finds it by that id. Either
    way, no second dataset and no second job."""
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_fireworks), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (job_id,) = await upstream_ids(first_store, shard)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if lost:
        meta = await first_store.backend_state.get(shard_meta_key(shard))
        assert meta is not None and meta["parts"][0]["file_id"] == job_id
        meta["parts"][0]["batch_id"] = None
        await first_store.backend_state.put(shard_meta_key(shard), meta)
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_fireworks), {}, second_store)
        results = await run_shard(second, shard, requests)
        stats = slow_fireworks.stats()
        assert (stats["datasets_created"], stats["uploads"], stats["jobs_created"]) == (1, 1, 1), \
            "a restart must not make a dataset or a job again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [job_id]
    finally:
        await second_store.aclose()


def test_the_signed_urls_take_no_key(fireworks: Stub) -> None:
    """The stand-in is strict as Cloud Storage is: a signed URL with an Authorization header is refused (so the
    jobs' download, which passes, sends the key to Fireworks only)."""
    request = urllib.request.Request(f"{fireworks.url}/_signed/x", headers={"Authorization": "Bearer fw-key"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
    assert refused.value.code == 400


def _config(info: dict[str, Any]) -> dict[str, Any]:
    return {"model_list": [{"model_name": "fw-bulk", "litellm_params": {"model": f"fireworks_ai/{MODEL}"},
                            "model_info": {"batch_mode": "native", **info}}]}


def test_a_deployment_names_its_account_and_is_priced_at_half_the_real_time_price() -> None:
    """Without `native_account_id` the config is refused at load in Fireworks' words; with it, the route's batch
    price is half LiteLLM's real-time one (LiteLLM's map has no Fireworks batch prices)."""
    from gateway.cli.config_check import route_rows

    with pytest.raises(ConfigError) as refused:
        parse_config(_config({}), "bulk.yaml")
    assert "native_account_id" in str(refused.value) and "Fireworks account" in str(refused.value)
    with pytest.raises(ConfigError) as elsewhere:  # Fireworks' own key, refused on another provider
        parse_config({"model_list": [{"model_name": "gpt-bulk", "litellm_params": {"model": "openai/gpt-4o-mini"},
                                      "model_info": {"batch_mode": "native", "native_account_id": ACCOUNT}}]})
    assert "native_account_id" in str(elsewhere.value)
    config = parse_config(_config({"native_account_id": ACCOUNT}))
    assert {r.model_name: r.prices for r in route_rows(config)} == {"fw-bulk": "0.05 / 0.05"}
