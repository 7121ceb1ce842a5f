"""Native batches on Amazon Bedrock: batch inference jobs over moto's S3 (a real S3 server) and the Bedrock
stand-in (tests/fakes/stubs_bedrock.py), reached by boto3 through AWS's standard endpoint variables. Nothing
is mocked.

The spec: records in S3 as `{recordId, modelInput}` (Claude's InvokeModel body, LiteLLM's translation), one job
per part, results back as `chat.completion`s with usage at the batch rate, inputs and outputs gone from the
bucket afterwards (or kept, as configured); a part below Bedrock's 100-record minimum answered in real time,
never failed; an unmappable line's 400; a failed or expired job; cancel; a restart that polls its job.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.routes import Route
from gateway.config.schema import parse_config
from gateway.errors import ConfigError
from gateway.store.sqlite.store import SQLiteStore
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.stub_process import Stub, start_stub
from tests.servers.test_native import ROUTE, cancelled_mid_poll, content, new_shard, run_shard, upstream_ids
from tests.servers.test_native_providers import chat
from tests.support.native_config import ROLE, native_route
from tests.support.services import S3_ENV, MotoS3

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    moto = MotoS3("batchyard-bedrock").start()
    saved = {k: os.environ.get(k) for k in (*S3_ENV, "AWS_ENDPOINT_URL_S3")}
    os.environ.update({**S3_ENV, "AWS_ENDPOINT_URL_S3": moto.url})
    try:
        yield moto
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        moto.close()


def _bedrock(s3: MotoS3, delay: str, min_records: str = "100") -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_bedrock", ["--batch-delay", delay, "--s3-endpoint", s3.url,
                                                    "--min-records", min_records])
    os.environ["AWS_ENDPOINT_URL_BEDROCK"] = stub.url
    try:
        yield stub
    finally:
        os.environ.pop("AWS_ENDPOINT_URL_BEDROCK", None)
        stub.stop()


@pytest.fixture
def bedrock(s3: MotoS3) -> Iterator[Stub]:
    yield from _bedrock(s3, "0.3")


@pytest.fixture
def slow_bedrock(s3: MotoS3) -> Iterator[Stub]:
    """Jobs long enough to cancel or restart; a minimum of 2 records (the route's `native_min_records: 2`)."""
    yield from _bedrock(s3, "6", "2")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(stub: Stub, s3: MotoS3, **info: Any) -> Route:
    params = {"model": f"bedrock/{MODEL}", "api_base": stub.url, "aws_region_name": "us-east-1"}
    return native_route(params, native_s3_bucket=s3.bucket, native_role_arn=ROLE, **info)


def bucket_keys(s3: MotoS3) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
    return [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])]


async def test_a_job_of_records_in_s3_answers_at_the_batch_rate_and_leaves_the_bucket_empty(
    bedrock: Stub, s3: MotoS3, store: SQLiteStore
) -> None:
    import litellm

    backend = NativeBatchBackend(route(bedrock, s3), {}, store)
    requests = [chat(i) for i in range(1, 121)]
    shard = await new_shard(store, len(requests))
    results = await run_shard(backend, shard, requests)
    assert bedrock.stats()["batches_created"] == 1 and bedrock.stats()["batch_requests"] == 120
    sent = bedrock.stats()["inputs_seen"][0]  # LiteLLM's Claude-on-Bedrock body: system on top, no model
    assert sent["anthropic_version"] == "bedrock-2023-05-31" and sent["max_tokens"] == 32 and "model" not in sent
    assert [m["role"] for m in sent["messages"]] == ["user"] and "Answer briefly." in str(sent["system"])
    for req, res in zip(requests, results, strict=True):
        assert (res.custom_id, res.status_code) == (req.custom_id, 200)
        assert content(res) == f"echo: hello number {req.line}" and res.body is not None
        assert res.body["object"] == "chat.completion" and res.body["model"] == MODEL
        assert (res.usage.input_tokens, res.usage.output_tokens) == (5, 4)
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert summary["upstream_batch_ids"] == await upstream_ids(store, shard)
    price = litellm.model_cost[MODEL]  # no *_batches price in the map: the real-time one halved
    assert summary["cost_usd"] == pytest.approx(120 * (5 * price["input_cost_per_token"]
                                                       + 4 * price["output_cost_per_token"]) / 2)
    assert bucket_keys(s3) == []  # input, output and manifest deleted with the batch


async def test_keep_files_keeps_them_and_a_record_error_keeps_its_code(
    bedrock: Stub, s3: MotoS3, store: SQLiteStore
) -> None:
    backend = NativeBatchBackend(route(bedrock, s3, native_keep_files=True, native_s3_prefix="kept"), {}, store)
    requests = [chat(i, "busy #fail:429" if i == 7 else None) for i in range(1, 101)]
    results = await run_shard(backend, await new_shard(store, 100), requests)
    failed = results[6]
    assert failed.status_code == 429 and failed.body is not None and failed.body["error"]["code"] == "429"
    assert all(r.ok for r in results if r.line != 7)
    keys = bucket_keys(s3)
    assert any(k.startswith("kept/input/") for k in keys) and any(k.endswith(".jsonl.out") for k in keys)


async def test_below_the_minimum_records_the_lines_run_in_real_time(bedrock: Stub, s3: MotoS3,
                                                                     store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(bedrock, s3), {}, store)
    requests = [chat(i) for i in range(1, 21)] + [chat(21, logit_bias={"50256": -100})]
    results = await run_shard(backend, await new_shard(store, 21), requests)
    stats = bedrock.stats()
    assert stats.get("batches_created", 0) == 0 and stats["realtime"] == 20  # never a job Bedrock would refuse
    for res in results[:20]:
        assert res.status_code == 200 and content(res) == f"echo: hello number {res.line}"
        assert (res.usage.input_tokens, res.usage.output_tokens) == (5, 4)
    refused = results[20]  # unmappable: its 400, before anything is sent
    assert refused.status_code == 400 and refused.body is not None
    assert refused.body["error"]["code"] == "unsupported_parameter" and refused.body["error"]["param"] == "logit_bias"


@pytest.mark.parametrize(("directive", "code"), [("#batch:fail", "upstream_batch_failed"),
                                                  ("#batch:expire", "batch_expired")])
async def test_a_failed_or_expired_job_fails_every_line(directive: str, code: str, bedrock: Stub, s3: MotoS3,
                                                        store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(bedrock, s3), {}, store)
    requests = [chat(i, f"poison {directive}" if i == 2 else None) for i in range(1, 101)]
    results = await run_shard(backend, await new_shard(store, 100), requests)
    for res in results:
        assert res.status_code is None and res.error is not None and res.error["code"] == code, res


async def test_cancel_stops_the_job(slow_bedrock: Stub, s3: MotoS3, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(route(slow_bedrock, s3, native_min_records=2), {}, store)
    (job_arn,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == [] and slow_bedrock.stats()["cancels"] == 1 and job_arn.startswith("arn:aws:bedrock:")


async def test_restart_polls_the_job_it_created(slow_bedrock: Stub, s3: MotoS3, tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(slow_bedrock, s3, native_min_records=2), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (job_arn,) = await upstream_ids(first_store, shard)
    task.cancel()  # a shutdown mid-poll
    with pytest.raises(asyncio.CancelledError):
        await task
    await first_store.aclose()
    second_store = SQLiteStore(path)
    try:
        second = NativeBatchBackend(route(slow_bedrock, s3, native_min_records=2), {}, second_store)
        results = await run_shard(second, shard, requests[1:])
        assert slow_bedrock.stats()["batches_created"] == 1, "a restart must not create the job again"
        assert all(r.ok for r in results)
        assert (await native_route_summary(second_store, shard.batch_id, ROUTE))["upstream_batch_ids"] == [job_arn]
    finally:
        await second_store.aclose()


@pytest.mark.parametrize(("info", "words"), [
    ({"native_role_arn": ROLE}, "needs native_s3_bucket"),
    ({"native_s3_bucket": "b"}, "needs native_role_arn"),
])
def test_config_refuses_a_bedrock_route_without_its_storage(info: dict[str, Any], words: str) -> None:
    raw = {"model_list": [{"model_name": "claude-bulk", "litellm_params": {"model": f"bedrock/{MODEL}"},
                           "model_info": {"batch_mode": "native", **info}}]}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "bulk.yaml")
    assert words in str(refused.value)


def test_config_refuses_bedrock_keys_elsewhere_and_other_bedrock_models() -> None:
    storage = {"native_s3_bucket": "b", "native_role_arn": ROLE}
    for model, words in (("anthropic/claude-haiku-4-5", "native_role_arn, native_s3_bucket: not a setting"),
                         ("bedrock/amazon.nova-lite-v1:0", "anthropic.claude-* models only")):
        raw = {"model_list": [{"model_name": "bulk", "litellm_params": {"model": model},
                               "model_info": {"batch_mode": "native", **storage}}]}
        with pytest.raises(ConfigError) as refused:
            parse_config(raw, "bulk.yaml")
        assert words in str(refused.value), refused.value
