"""Upstream-native batches (`providers.native.runner`) against the real loopback upstream
(tests/fakes/upstream/server.py): LiteLLM's own file and batch functions talk HTTP to it, for OpenAI's and Azure's
forms. Nothing is mocked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config.routes import Route
from gateway.config.schema import Config
from gateway.domain import BatchRequest, BatchStatus, Endpoint, Result, Shard, new_id
from gateway.runtime.runtime import open_embedded
from gateway.store.protocols import Store
from gateway.store.records import BatchRecord, now
from gateway.store.sqlite.store import SQLiteStore
from providers.native.openai_format import cost_meta_key, plan_parts, shard_meta_key
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.native_config import AZURE_API_VERSION as API_VERSION
from tests.support.native_config import ROUTE
from tests.support.native_config import native_route as configured_route
from tests.support.waiting import eventually_async


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(batch_delay=0.6) as server:
        yield server


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[Upstream]:
    """Upstream batches that take long enough to be cancelled for sure."""
    with start_upstream(batch_delay=8) as server:
        yield server


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def native_route(upstream: Upstream, provider: str = "openai", **info: Any) -> Route:
    if provider == "azure":
        params = {"model": "azure/my-gpt4o-deployment", "api_base": upstream.url, "api_key": "sk-azure",
                  "api_version": API_VERSION}
    else:
        params = {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": "sk-openai"}
    return configured_route(params, **info)


def chat(line: int, text: str | None = None) -> BatchRequest:
    body = {"model": ROUTE, "messages": [{"role": "user", "content": text or f"hello number {line}"}]}
    return BatchRequest(line=line, custom_id=f"task-{line}", url=Endpoint.CHAT, body=body)


async def new_shard(store: SQLiteStore, size: int, status: BatchStatus = BatchStatus.IN_PROGRESS) -> Shard:
    batch_id = new_id("batch")
    t = now()
    await store.batches.put(BatchRecord(id=batch_id, owner="", endpoint="*", input_file_id="file-x",
                                      completion_window="24h", status=status, created_at=t, expires_at=t + 3600))
    shard = Shard(batch_id=batch_id, index=0, route=ROUTE, size=size)
    await store.ledger.put_shards(batch_id, [shard])
    return shard


async def run_shard(backend: NativeBatchBackend, shard: Shard, requests: list[BatchRequest]) -> list[Result]:
    await backend.start()
    results = [r async for r in backend.execute_shard(shard, requests)]
    assert sorted(r.line for r in results) == sorted(r.line for r in requests), "one result per request"
    return sorted(results, key=lambda r: r.line)


async def upstream_ids(store: Store, shard: Shard, timeout: float = 10.0) -> list[str]:
    """The upstream batch ids the backend recorded for a shard (waits for the first one)."""
    async def recorded() -> list[str]:
        meta = await store.backend_state.get(shard_meta_key(shard))
        return [p["batch_id"] for p in (meta or {}).get("parts", []) if p.get("batch_id")]

    return await eventually_async(recorded, timeout, "an upstream batch recorded", interval=0.02)


async def upstream_status(upstream: Upstream, batch_id: str) -> str:
    import litellm

    batch = await litellm.aretrieve_batch(batch_id=batch_id, custom_llm_provider="openai", api_base=upstream.v1_url,
                                          api_key="sk-openai")
    return str(batch.status)


def content(result: Result) -> str:
    assert result.body is not None
    return str(result.body["choices"][0]["message"]["content"])


# -- backend level -----------------------------------------------------------------------------------


async def test_openai_shard_split_into_upstream_batches(upstream: Upstream, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(native_route(upstream, native_max_lines=3, input_cost_per_token=2e-6,
                                              output_cost_per_token=4e-6), {}, store)
    requests = [chat(i) for i in (2, 3, 5, 8, 9, 11)] + [chat(12, "please #fail:429 now")]
    shard = await new_shard(store, len(requests))
    before = upstream.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert upstream.stats()["batches_created"] - before == 3  # 7 lines, 3 per upstream file
    for req, res in zip(requests[:-1], results[:-1], strict=True):
        assert (res.line, res.custom_id, res.status_code, res.model) == (req.line, req.custom_id, 200, ROUTE)
        assert content(res) == f"echo: hello number {req.line}"
        assert res.body is not None and res.body["model"] == "gpt-4o-mini"  # the deployment's model went upstream
    failed = results[-1]
    assert (failed.custom_id, failed.status_code) == ("task-12", 429)
    assert failed.body is not None and failed.body["error"]["code"] == "rate_limit_exceeded"

    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    ids = await upstream_ids(store, shard)
    assert summary["upstream_batch_ids"] == ids and len(ids) == 3
    inp = sum(r.usage.input_tokens for r in results)
    out = sum(r.usage.output_tokens for r in results)
    assert (summary["input_tokens"], summary["output_tokens"]) == (inp, out) and inp > 0
    assert summary["cost_usd"] == pytest.approx(inp * 1e-6 + out * 2e-6)  # batch rates: half the listed price
    accumulated = await store.backend_state.get(cost_meta_key(shard.batch_id, ROUTE))
    assert accumulated is not None and accumulated["cost_usd"] == pytest.approx(summary["cost_usd"])
    assert accumulated["upstream_batch_ids"] == ids


async def test_azure_shard(upstream: Upstream, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(native_route(upstream, "azure", output_cost_per_token_batches=1e-6), {}, store)
    requests = [chat(i) for i in range(1, 6)]
    shard = await new_shard(store, len(requests))
    before = upstream.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert upstream.stats()["batches_created"] - before == 1
    assert [r.custom_id for r in results] == [f"task-{i}" for i in range(1, 6)]
    assert [content(r) for r in results] == [f"echo: hello number {i}" for i in range(1, 6)]
    assert all(r.body is not None and r.body["model"] == "my-gpt4o-deployment" for r in results)
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert summary["cost_usd"] == pytest.approx(summary["output_tokens"] * 1e-6)


@pytest.mark.parametrize(
    ("directive", "code", "words"),
    [("#batch:fail", "upstream_batch_failed", "#batch:fail directive"), ("#batch:expire", "batch_expired", "expired")],
)
async def test_upstream_batch_failed_or_expired(
    upstream: Upstream, store: SQLiteStore, directive: str, code: str, words: str
) -> None:
    backend = NativeBatchBackend(native_route(upstream), {}, store)
    requests = [chat(1), chat(2, f"poison {directive}"), chat(3)]
    results = await run_shard(backend, await new_shard(store, 3), requests)
    for res in results:
        assert res.status_code is None and res.error is not None, res
        assert res.error["code"] == code and words in res.error["message"]


async def test_cancel_mid_poll_cancels_upstream(slow_upstream: Upstream, store: SQLiteStore) -> None:
    upstream = slow_upstream
    backend = NativeBatchBackend(native_route(upstream), {}, store)
    await backend.start()
    shard = await new_shard(store, 2)
    requests = [chat(1), chat(2)]
    got: list[Result] = []

    async def consume() -> None:
        async for r in backend.execute_shard(shard, requests):
            got.append(r)

    task = asyncio.create_task(consume())
    (batch_id,) = await upstream_ids(store, shard)
    await store.batches.update(shard.batch_id, {"status": BatchStatus.CANCELLING, "cancelling_at": now()})
    task.cancel()  # what the pipeline does when it sees the batch cancelled
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == []
    assert await upstream_status(upstream, batch_id) in ("cancelling", "cancelled")


async def test_pipeline_cancel_cancels_upstream(slow_upstream: Upstream, tmp_path: Path) -> None:
    """Through the pipeline: cancelling our batch cancels the consuming task, which cancels the upstream batch."""
    upstream = slow_upstream
    route = native_route(upstream)
    batch_id = await cancel_once_submitted(route, tmp_path, lambda i: {
        "model": ROUTE, "messages": [{"role": "user", "content": f"q {i}"}]})
    assert await upstream_status(upstream, batch_id) in ("cancelling", "cancelled")


async def cancelled_mid_poll(backend: NativeBatchBackend, store: SQLiteStore,
                             lines: list[BatchRequest]) -> tuple[list[str], list[Result]]:
    """`backend` started and one shard of `lines` set off; once the provider's job exists, our batch is
    cancelling and the shard's task cancelled, as the pipeline does. The provider's job ids, and what the
    shard yielded before it was cancelled."""
    await backend.start()
    shard = await new_shard(store, len(lines))
    got: list[Result] = []

    async def consume() -> None:
        async for r in backend.execute_shard(shard, lines):
            got.append(r)

    task = asyncio.create_task(consume())
    ids = await upstream_ids(store, shard)
    await store.batches.update(shard.batch_id, {"status": BatchStatus.CANCELLING, "cancelling_at": now()})
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return ids, got


async def cancel_once_submitted(route: Route, tmp_path: Path, body: Callable[[int], dict[str, Any]]) -> str:
    """Three chat lines on the native `route` through the pipeline, our batch cancelled once the provider's job
    exists: our batch ends cancelled with every line failed, the job's id kept in the batch record and the
    route's native state dropped. Returns the provider's job id."""
    pipeline = await open_embedded(Config(path="test", routes={ROUTE: route}), tmp_path / "data")
    try:
        await pipeline.start()

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(1, 4):
                yield json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": body(i)}).encode() + b"\n"

        source = await pipeline.service.upload_file("", "in.jsonl", "batch", chunks())
        batch = await pipeline.service.create_batch("", input_file_id=source.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h")
        (shard,) = await wait_shards(pipeline.store, batch.id)
        (batch_id,) = await upstream_ids(pipeline.store, shard)
        await pipeline.service.cancel_batch(batch.id, "")
        done = await asyncio.wait_for(pipeline.service.wait(batch.id), 20)
        assert done.status is BatchStatus.CANCELLED
        # finalize copied the route's summary into the batch record, then dropped the native state
        assert done.routes[ROUTE]["upstream_batch_ids"] == [batch_id]
        assert done.counts.failed == done.counts.total == 3  # unrun lines count as failed
        assert (await native_route_summary(pipeline.store, batch.id, ROUTE))["upstream_batch_ids"] == []
        return str(batch_id)
    finally:
        await pipeline.aclose()


async def wait_shards(store: Store, batch_id: str) -> list[Shard]:
    async def planned() -> list[Shard]:
        return list(await store.ledger.get_shards(batch_id))

    return await eventually_async(planned, 10, "the batch to be planned")


async def test_restart_resumes_upstream_batches(upstream: Upstream, tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(native_route(upstream), {}, first_store)
    await first.start()
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    async def first_result() -> Result:
        return await anext(first.execute_shard(shard, requests))

    task = asyncio.create_task(first_result())
    (batch_id,) = await upstream_ids(first_store, shard)
    created = upstream.stats()["batches_created"]
    task.cancel()  # the process goes away mid-poll; our batch is still in progress
    with pytest.raises(asyncio.CancelledError):
        await task
    await first.aclose()
    await first_store.aclose()
    assert await upstream_status(upstream, batch_id) not in ("cancelling", "cancelled")

    second_store = SQLiteStore(path)  # a new process: new store connection, new backend
    try:
        second = NativeBatchBackend(native_route(upstream), {}, second_store)
        todo = requests[1:]  # line 1 was recorded before the restart
        results = await run_shard(second, shard, todo)
        assert upstream.stats()["batches_created"] == created, "a restart must not create a new upstream batch"
        assert [r.custom_id for r in results] == [r.custom_id for r in todo]
        assert all(r.status_code == 200 for r in results)
        summary = await native_route_summary(second_store, shard.batch_id, ROUTE)
        assert summary["upstream_batch_ids"] == [batch_id]
        assert summary["input_tokens"] == 4 * 3  # every line of the upstream batch counts, recorded ones too
    finally:
        await second_store.aclose()


async def test_execute_without_shard(upstream: Upstream, store: SQLiteStore) -> None:
    backend = NativeBatchBackend(native_route(upstream), {}, store)
    await backend.start()
    results = [r async for r in backend.execute([chat(7), chat(8)])]
    assert sorted(r.custom_id for r in results) == ["task-7", "task-8"]
    assert all(r.ok for r in results)


def test_parts_split_by_lines_bytes_and_endpoint() -> None:
    requests = [chat(i, "x" * 200) for i in range(1, 7)]
    requests.append(BatchRequest(line=7, custom_id="e", url=Endpoint.EMBEDDINGS, body={"model": "m", "input": "a"}))
    requests.append(chat(8, "y" * 5_000))
    size = len(json.dumps({"custom_id": "l1", "method": "POST", "url": "/chat/completions",
                           "body": {**requests[0].body, "model": "m" * 64}}, separators=(",", ":"))) + 1
    parts, too_big = plan_parts(requests, "azure", max_lines=4, max_bytes=2 * size + 10)
    assert [p.lines for p in parts] == [[1, 2], [3, 4], [5, 6], [7]]
    assert [p.endpoint for p in parts] == ["/chat/completions"] * 3 + ["/embeddings"]
    assert [r.line for r in too_big] == [8]


# -- end to end: the CLI with one native and one real-time route -----------------------------------------


def test_cli_mixed_file_native_and_realtime(upstream: Upstream, tmp_path: Path) -> None:
    config = {
        "model_list": [
            {"model_name": "gpt-cheap", "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url,
                                                            "api_key": "sk-openai"},
             "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2}},
            {"model_name": "gpt-fast", "litellm_params": {"model": "openai/gpt-4o", "api_base": upstream.v1_url,
                                                           "api_key": "sk-openai"}},
        ],
    }
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    lines = []
    for i in range(1, 13):
        model = "gpt-cheap" if i % 3 else "gpt-fast"
        body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}]}
        lines.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = upstream.stats()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    cli = Path(sys.executable).parent / "batchyard"
    proc = subprocess.run([str(cli), "run", "-i", str(inp), "-o", str(out), "--config", str(cfg), "-q"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    after = upstream.stats()
    output = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["custom_id"] for o in output] == [f"q{i}" for i in range(1, 13)]  # input order, each once
    for i, o in enumerate(output, 1):
        assert o["response"]["status_code"] == 200 and o["error"] is None
        assert o["response"]["body"]["choices"][0]["message"]["content"] == f"echo: question {i}"
        assert o["response"]["body"]["model"] == ("gpt-4o" if i % 3 == 0 else "gpt-4o-mini")
    assert after["batches_created"] - before["batches_created"] >= 1
    assert after["batch_lines"] - before["batch_lines"] == 8  # gpt-cheap's lines went as an upstream batch
    assert after["requests"] - before["requests"] == 4  # gpt-fast's lines went one call each
    assert after["by_model"].get("gpt-4o", 0) - before["by_model"].get("gpt-4o", 0) == 4


@pytest.mark.parametrize("provider", ["openai", "azure"])
async def test_moderations_and_images_run_as_native_jobs(provider: str, upstream: Upstream,
                                                         store: SQLiteStore) -> None:
    """OpenAI's batch takes `/v1/moderations`, `/v1/images/generations` and `/v1/images/edits` (its JSON form):
    each goes as a job of its own endpoint, and its answers come back in OpenAI's shape."""
    backend = NativeBatchBackend(native_route(upstream, provider), {}, store)
    requests = [
        BatchRequest(line=1, custom_id="mod", url=Endpoint.MODERATIONS, body={"model": ROUTE, "input": "attack"}),
        BatchRequest(line=2, custom_id="img", url=Endpoint.IMAGES, body={"model": ROUTE, "prompt": "a red cat"}),
        BatchRequest(line=3, custom_id="edit", url=Endpoint.IMAGE_EDITS, body={
            "model": ROUTE, "prompt": "a hat", "images": [{"file_id": "file-cat"}]}),
    ]
    shard = await new_shard(store, len(requests))
    before = upstream.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert upstream.stats()["batches_created"] - before == 3  # one job per endpoint
    assert [r.status_code for r in results] == [200, 200, 200]
    bodies = [r.body or {} for r in results]
    assert bodies[0]["results"][0]["flagged"] is True
    assert bodies[1]["data"][0]["revised_prompt"] == "a red cat" and bodies[2]["data"][0]["revised_prompt"] == "a hat"


async def test_a_job_made_before_a_crash_is_found_past_the_hosts_first_page(upstream: Upstream,
                                                                            store: SQLiteStore) -> None:
    """The upload was recorded, the job created, the process died before recording it, and 25 newer jobs
    followed: the restart pages through the host's list as its pages say (`has_more`, `last_id`: OpenAI's 20 a
    page by default) and polls that job; it never creates a second one."""
    import litellm

    backend = NativeBatchBackend(native_route(upstream), {}, store)
    await backend.start()
    requests = [chat(1), chat(2)]
    shard = await new_shard(store, 2)
    jobs, _, _ = backend._deployment(0)
    assert jobs is not None
    kwargs = {"custom_llm_provider": "openai", "api_base": upstream.v1_url, "api_key": "sk-openai"}

    async def made(data: bytes) -> tuple[str, str]:
        upload = await litellm.acreate_file(file=("in.jsonl", data), purpose="batch", **kwargs)
        batch = await litellm.acreate_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                            input_file_id=upload.id, **kwargs)
        return str(upload.id), str(batch.id)

    file_id, batch_id = await made(b"".join(jobs.line(r) for r in requests))
    other = jobs.line(chat(9))
    for _ in range(25):
        await made(other)
    await store.backend_state.put(shard_meta_key(shard), {"deployment": 0, "parts": [
        {"endpoint": "/v1/chat/completions", "lines": [1, 2], "file_id": file_id}]})
    created = upstream.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert upstream.stats()["batches_created"] == created
    assert all(r.ok for r in results)
    assert await upstream_ids(store, shard) == [batch_id]
@pytest.mark.parametrize("limit", [{"native_max_lines": 3}, {"native_max_bytes": 500}], ids=["lines", "bytes"])
def test_a_file_of_many_shards_runs_as_jobs_within_the_route_limits(upstream: Upstream, tmp_path: Path,
                                                                     limit: dict[str, int]) -> None:
    """`batchyard run` of 40 lines in shards of 10 on a native route with a tiny job bound (in place of the
    provider's row in `providers.native.job_limits`): every upstream job holds at most that many lines or
    bytes, and the output is every line once, in input order."""
    config = {
        "model_list": [{"model_name": "gpt-cheap", "litellm_params": {
            "model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": "sk-openai"},
            "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2, **limit}}],
        "batch_settings": {"shard_size": 10},
    }
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": "gpt-cheap",
                                                "messages": [{"role": "user", "content": f"question {i}"}]}}) + "\n"
                           for i in range(40)))
    http = httpx.Client(base_url=upstream.v1_url, headers={"Authorization": "Bearer sk-openai"}, timeout=30)
    seen = {b["id"] for b in http.get("/batches", params={"limit": 100}).json()["data"]}
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(inp), "-o", str(out), "--config",
                           str(cfg), "-q"], capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    output = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["custom_id"] for o in output] == [f"q{i}" for i in range(40)]
    assert all(o["response"]["status_code"] == 200 for o in output)
    jobs = [b for b in http.get("/batches", params={"limit": 100}).json()["data"] if b["id"] not in seen]
    assert sum(b["request_counts"]["total"] for b in jobs) == 40
    assert len(jobs) > 4  # more than one job per shard: the shards were split further
    for job in jobs:
        assert job["request_counts"]["total"] <= limit.get("native_max_lines", 50_000)
        size = http.get(f"/files/{job['input_file_id']}").json()["bytes"]
        assert size <= limit.get("native_max_bytes", 190_000_000)
    http.close()


def test_run_takes_its_own_file_past_openais_caps(upstream: Upstream, tmp_path: Path) -> None:
    """`batchyard run` of 50,001 lines (past OpenAI's 50,000, which a shared API keeps by default) runs whole,
    in input order; a `max_lines` the config sets is still applied to it."""
    model = {"model_name": "gpt-cheap", "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url,
                                                            "api_key": "sk-openai"},
             "model_info": {"batch_mode": "native", "native_poll_initial_seconds": 0.1,
                            "native_poll_max_seconds": 0.3}}
    n = 50_001
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": "gpt-cheap", "messages": [{"role": "user", "content": "k"}]}})
                           + "\n" for i in range(n)))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    repo = Path(__file__).resolve().parents[2]

    def run(settings: dict[str, Any], out: Path) -> subprocess.CompletedProcess[str]:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"model_list": [model], "batch_settings": settings}))
        return subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(inp), "-o", str(out),
                               "--config", str(cfg), "-q"], capture_output=True, text=True, timeout=300, env=env,
                              cwd=repo)

    done = run({"shard_size": 10_000}, tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line)["custom_id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert seen == [f"q{i}" for i in range(n)]
    refused = run({"max_lines": 50_000}, tmp_path / "refused.jsonl")
    assert refused.returncode == 1 and "too_many_tasks" in refused.stderr, refused.stderr[-2000:]
