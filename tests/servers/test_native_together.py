"""Together AI's Batch API (`together_ai/`) against its stand-in (tests/fakes/stubs_together.py, written from
Together's reference: the `/v1/files/upload` multipart upload with `purpose=batch-api`, `{custom_id, body}` lines,
the wrapped create, upper-case statuses, the output and error files, cancel, the unpaged list). Nothing is mocked.

The spec every provider has: a shard split under the job limit answered in OpenAI's shape at the batch price; a
line's error; a failed and an expired job; cancel; a restart mid-poll, and a crash between the upload and the
recording of the job, found again by its input file; the prices' rule (no halved real-time price, refused at
load for a team with a budget when no batch price is known).
"""

from __future__ import annotations

import asyncio
import json
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

MODEL = "meta-llama/Llama-3.3-70B-Instruct-Turbo"  # in LiteLLM's map with real-time prices only
PRICED = {"input_cost_per_token_batches": 5e-7, "output_cost_per_token_batches": 6e-7}


@pytest.fixture(scope="module")
def together() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_together", ["--batch-delay", "0.3", "--max-requests", "3",
                                                   "--api-key", "t-key"]) as stub:
        yield stub


@pytest.fixture
def slow_together() -> Iterator[Stub]:
    """Jobs long enough to cancel or restart."""
    with start_stub("tests.fakes.stubs_together", ["--batch-delay", "6"]) as stub:
        yield stub


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, **info: Any) -> Route:
    return native_route({"model": f"together_ai/{MODEL}", "api_base": f"{stub.url}/v1", "api_key": "t-key"},
                        **{**PRICED, **info})


def job_status(stub: Stub, job_id: str) -> str:
    request = urllib.request.Request(f"{stub.url}/v1/batches/{job_id}", headers={"Authorization": "Bearer t-key"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as reply:
        return str(json.loads(reply.read())["status"])


async def test_a_shard_split_under_the_job_limit_answers_in_openai_shape_at_the_batch_price(
    together: Stub, store: SQLiteStore
) -> None:
    """The stand-in takes 3 requests a job: 7 lines are 3 uploads (purpose batch-api) and 3 jobs; a line the
    provider failed comes back as its error, in the error file."""
    backend = NativeBatchBackend(route(together, native_max_lines=3), {}, store)
    requests = [chat(i) for i in (2, 3, 5, 8, 9, 11)] + [chat(12, "please #fail:model_error now")]
    shard = await new_shard(store, len(requests))
    before = together.stats()
    results = await run_shard(backend, shard, requests)
    after = together.stats()
    assert after["batches_created"] - before.get("batches_created", 0) == 3
    assert after["purpose:batch-api"] - before.get("purpose:batch-api", 0) == 3
    for req, res in zip(requests[:-1], results[:-1], strict=True):
        assert (res.custom_id, res.status_code, res.model) == (req.custom_id, 200, ROUTE)
        assert content(res) == f"echo: hello number {req.line}"
        assert res.body is not None and res.body["model"] == MODEL and res.body["object"] == "chat.completion"
        assert res.cost_usd == pytest.approx(res.usage.input_tokens * 5e-7 + res.usage.output_tokens * 6e-7)
    failed = results[-1]
    assert failed.error is not None and failed.error["code"] == "model_error", failed
    assert "directive" in failed.error["message"]
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert len(summary["upstream_batch_ids"]) == 3
    billed = after["billed_input_tokens"] - before.get("billed_input_tokens", 0), \
        after["billed_output_tokens"] - before.get("billed_output_tokens", 0)
    assert (summary["input_tokens"], summary["output_tokens"]) == billed  # what Together bills, line for line
    assert summary["cost_usd"] == pytest.approx(billed[0] * 5e-7 + billed[1] * 6e-7)


@pytest.mark.parametrize(("directive", "code", "words"), [
    ("#batch:fail", "upstream_batch_failed", "The batch failed (#batch:fail directive)."),
    ("#batch:expire", "batch_expired", "expired before this request ran"),
])
async def test_a_failed_or_expired_job_gives_every_line_its_error(
    together: Stub, store: SQLiteStore, directive: str, code: str, words: str
) -> None:
    backend = NativeBatchBackend(route(together), {}, store)
    results = await run_shard(backend, await new_shard(store, 2), [chat(1), chat(2, f"poison {directive}")])
    for res in results:
        assert res.error is not None and res.error["code"] == code and words in res.error["message"], res


async def test_a_file_the_provider_refuses_in_validation_fails_the_job(together: Stub, store: SQLiteStore) -> None:
    """A custom_id of more than 64 characters (Together's bound) fails the whole job in VALIDATING: its reason
    reaches every line."""
    backend = NativeBatchBackend(route(together), {}, store)
    results = await run_shard(backend, await new_shard(store, 1), [chat(10 ** 70)])
    (res,) = results
    assert res.error is not None and res.error["code"] == "upstream_batch_failed"
    assert "custom_id must be a string of at most 64 characters" in res.error["message"]


async def test_cancel_cancels_the_job(slow_together: Stub, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(slow_together), {}, store)
    (job_id,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_together.stats()["cancels"] == 1
    assert job_status(slow_together, job_id) == "CANCELLED"


@pytest.mark.parametrize("lost", [False, True], ids=["recorded", "lost-before-recording"])
async def test_restart_polls_the_job_it_created(slow_together: Stub, tmp_path: Path, lost: bool) -> None:
    """A shutdown mid-poll: the restart polls the recorded job. `lost`: the process died between Together's reply
    to the create and the store's write: the restart finds the job by its input file in Together's list. Either
    way, no second upload and no second job."""
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_together), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (job_id,) = await upstream_ids(first_store, shard)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if lost:
        meta = await first_store.backend_state.get(shard_meta_key(shard))
        assert meta is not None and str(meta["parts"][0]["file_id"]).startswith("file-")
        meta["parts"][0]["batch_id"] = None
        await first_store.backend_state.put(shard_meta_key(shard), meta)
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_together), {}, second_store)
        results = await run_shard(second, shard, requests)
        stats = slow_together.stats()
        assert (stats["uploads"], stats["batches_created"]) == (1, 1), "a restart must not upload or create again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [job_id]
    finally:
        await second_store.aclose()


def _config(info: dict[str, Any], budget: float | None) -> dict[str, Any]:
    team = {"team_id": "t", "api_keys": ["sk-t"], **({"max_budget": budget} if budget is not None else {})}
    return {"model_list": [{"model_name": "together-bulk", "litellm_params": {"model": f"together_ai/{MODEL}"},
                            "model_info": {"batch_mode": "native", **info}}],
            "batch_settings": {"teams": [team]}}


def test_a_batch_price_is_the_maps_or_the_configs_never_a_halved_real_time_one() -> None:
    """LiteLLM's map prices MODEL in real time only, and Together discounts some models only: with no batch price
    the route is unpriced, refused at load for a team with a budget; the config's price is taken as written."""
    from gateway.cli.config_check import route_rows

    with pytest.raises(ConfigError) as refused:
        parse_config(_config({}, 10.0), "bulk.yaml")
    assert "no batch price is known for together_ai/" in str(refused.value)
    assert "team 't' has a max_budget" in str(refused.value)
    unbudgeted = parse_config(_config({}, None))
    assert {r.model_name: r.prices for r in route_rows(unbudgeted)} == {"together-bulk": "-"}
    for info, shown in ((PRICED, "0.5 / 0.6"), ({"input_cost_per_token": 8e-7, "output_cost_per_token": 9e-7},
                                                 "0.8 / 0.9")):
        config = parse_config(_config(info, 10.0))
        assert {r.model_name: r.prices for r in route_rows(config)} == {"together-bulk": shown}
