"""Native batches beyond OpenAI: Anthropic's Message Batches and Mistral's batch jobs, through LiteLLM's batch
functions, against their loopback stand-ins (tests/fakes/stubs_anthropic.py, tests/fakes/stubs_mistral.py).
Nothing is mocked.

Each provider, the same spec: a shard split under the provider's job limit; OpenAI-shaped chat completions back
with usage; cost at the provider's batch rates; a line's error with the provider's code; a job that fails or
expires; cancel; a restart that polls the job it created and never creates it twice.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.native_declarations import native_declarations
from gateway.config.routes import Route, RouteKind
from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint
from gateway.errors import ConfigError
from gateway.store.sqlite.store import SQLiteStore
from providers.native.catalog import jobs_class
from providers.native.contract import UpstreamHTTPError, http_lines
from providers.native.job_limits import job_limits
from providers.native.openai_format import shard_meta_key
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.stub_process import Stub, start_stub
from tests.servers.test_native import (
    ROUTE,
    cancel_once_submitted,
    cancelled_mid_poll,
    content,
    new_shard,
    run_shard,
    upstream_ids,
)
from tests.support.native_config import native_route

PROVIDERS = ["anthropic", "mistral", "gemini"]
# A model LiteLLM's price map knows, per provider: claude-haiku-4-5 has batch prices of its own
# (input 5e-7, output 2.5e-6 per token); mistral-small-latest only real-time ones, which a batch halves.
MODELS = {"anthropic": "claude-haiku-4-5", "mistral": "mistral-small-latest", "gemini": "gemini-2.5-flash-lite"}
BATCH_RATES = {"anthropic": (5e-7, 2.5e-6), "mistral": (1.5e-7 / 2, 6e-7 / 2), "gemini": (5e-8, 2e-7)}
MODULES = {"anthropic": "tests.fakes.stubs_anthropic", "mistral": "tests.fakes.stubs_mistral",
           "gemini": "tests.fakes.stubs_gemini"}


@pytest.fixture(scope="module")
def stubs() -> Iterator[dict[str, Stub]]:
    started = {p: start_stub(m, ["--batch-delay", "0.4", "--max-requests", "3"]) for p, m in MODULES.items()}
    try:
        yield started
    finally:
        for stub in started.values():
            stub.stop()


@pytest.fixture(scope="module")
def slow_stubs() -> Iterator[dict[str, Stub]]:
    """Jobs that take long enough to be cancelled (or restarted) for sure."""
    started = {p: start_stub(m, ["--batch-delay", "6"]) for p, m in MODULES.items()}
    try:
        yield started
    finally:
        for stub in started.values():
            stub.stop()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


def route(provider: str, stub: Stub, **info: Any) -> Route:
    return native_route({"model": f"{provider}/{MODELS[provider]}", "api_base": stub.url,
                         "api_key": f"sk-{provider}"}, **info)


def chat(line: int, text: str | None = None, **extra: Any) -> BatchRequest:
    body = {"model": ROUTE, "messages": [{"role": "system", "content": "Answer briefly."},
                                         {"role": "user", "content": text or f"hello number {line}"}],
            "max_tokens": 32, **extra}
    return BatchRequest(line=line, custom_id=f"task-{line}", url=Endpoint.CHAT, body=body)


def stub_get(stub: Stub, path: str, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(stub.url + path, headers=headers)
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as reply:
        return json.loads(reply.read())


def upstream_status(provider: str, stub: Stub, batch_id: str) -> str:
    """The job's status in the provider's own words, asked of the stand-in directly."""
    if provider == "anthropic":
        obj = stub_get(stub, f"/v1/messages/batches/{batch_id}", {"x-api-key": "k", "anthropic-version": "2023-06-01"})
        return str(obj["processing_status"])
    if provider == "gemini":
        return str(stub_get(stub, f"/v1beta/batches/{batch_id}", {"x-goog-api-key": "k"})["metadata"]["state"])
    return str(stub_get(stub, f"/v1/batch/jobs/{batch_id}", {"authorization": "Bearer k"})["status"])


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_shard_split_under_the_job_limit_answers_in_openai_shape_at_batch_rates(
    provider: str, stubs: dict[str, Stub], store: SQLiteStore
) -> None:
    stub = stubs[provider]
    # The stand-ins refuse a job over 3 requests (--max-requests 3): the route's limit splits 7 lines into 3 jobs.
    backend = NativeBatchBackend(route(provider, stub, native_max_lines=3), {}, store)
    requests = [chat(i) for i in (2, 3, 5, 8, 9, 11, 12)]
    shard = await new_shard(store, len(requests))
    before = stub.stats()
    results = await run_shard(backend, shard, requests)
    after = stub.stats()
    assert after.get("batches_created", 0) - before.get("batches_created", 0) == 3
    assert after.get("batch_requests", 0) - before.get("batch_requests", 0) == 7
    for req, res in zip(requests, results, strict=True):
        assert (res.line, res.custom_id, res.status_code, res.model) == (req.line, req.custom_id, 200, ROUTE)
        assert res.body is not None and res.body["object"] == "chat.completion"
        assert res.body["choices"][0]["message"] == {**res.body["choices"][0]["message"], "role": "assistant",
                                                     "content": f"echo: hello number {req.line}"}
        assert res.body["model"] == MODELS[provider]  # the deployment's model went upstream
        usage = res.body["usage"]
        assert usage["prompt_tokens"] == 5 and usage["completion_tokens"] == 4  # system + user words; the reply
        assert (res.usage.input_tokens, res.usage.output_tokens) == (5, 4)
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert summary["upstream_batch_ids"] == await upstream_ids(store, shard) and len(summary["upstream_batch_ids"]) == 3
    assert (summary["input_tokens"], summary["output_tokens"]) == (7 * 5, 7 * 4)
    rate_in, rate_out = BATCH_RATES[provider]  # from LiteLLM's price map: no price in the config
    assert summary["cost_usd"] == pytest.approx(35 * rate_in + 28 * rate_out)


async def test_anthropic_lines_are_translated_by_litellm(stubs: dict[str, Stub], store: SQLiteStore) -> None:
    """The system prompt becomes Messages' top-level `system`, stop becomes `stop_sequences`; a parameter
    Anthropic has no counterpart for is that line's 400 before any job is made."""
    stub = stubs["anthropic"]
    backend = NativeBatchBackend(route("anthropic", stub), {}, store)
    # Not a whitespace-only stop: LiteLLM drops those for Anthropic (which refuses them) whenever its process-wide
    # `drop_params` is on, as it is in any process that has started an upstream route (`litellm_setup`).
    requests = [chat(1, "héllo ✓ \u2028 «quoted»", stop=["END"], temperature=0.2),
                chat(2, logit_bias={"50256": -100})]
    results = await run_shard(backend, await new_shard(store, 2), requests)
    # found by its text: the stand-in is shared by the module's tests, whose jobs may still be arriving
    params = next(p for p in stub.stats()["params_seen"] if "héllo ✓" in json.dumps(p["messages"], ensure_ascii=False))
    assert params["system"] == [{"type": "text", "text": "Answer briefly."}]
    assert [m["role"] for m in params["messages"]] == ["user"]
    assert (params["stop_sequences"], params["temperature"], params["max_tokens"]) == (["END"], 0.2, 32)
    assert results[0].status_code == 200 and content(results[0]) == "echo: héllo ✓ \u2028 «quoted»"
    refused = results[1]
    assert refused.status_code == 400 and refused.body is not None
    assert refused.body["error"]["code"] == "unsupported_parameter"
    assert refused.body["error"]["param"] == "logit_bias" and refused.body["error"]["type"] == "invalid_request_error"


async def test_gemini_lines_are_translated_by_litellm(stubs: dict[str, Stub], store: SQLiteStore) -> None:
    """The system prompt becomes `systemInstruction`, assistant turns the `model` role, sampling fields
    `generationConfig`; a parameter Gemini has no counterpart for (or `stream`, which a batch cannot honour) is that
    line's 400 before any job is made. LiteLLM writes the proto's snake_case names (`system_instruction`,
    `max_output_tokens`), which Google's JSON parser takes beside the reference's lowerCamelCase: the stand-in
    takes both and nothing else."""
    stub = stubs["gemini"]
    backend = NativeBatchBackend(route("gemini", stub), {}, store)
    turns = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "first ünïcode"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "gemini «second» turn"}]
    requests = [chat(1, stop=["END"], temperature=0.2), chat(2, logit_bias={"50256": -100}), chat(3, stream=True)]
    requests[0].body["messages"] = turns
    before = stub.stats().get("batches_created", 0)
    results = await run_shard(backend, await new_shard(store, 3), requests)
    assert stub.stats()["batches_created"] == before + 1  # the refused lines made no job of their own
    sent = next(r for r in stub.stats()["requests_seen"] if "«second»" in json.dumps(r, ensure_ascii=False))
    assert sent["system_instruction"] == {"parts": [{"text": "Answer briefly."}]}
    assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
    assert sent["generationConfig"] == {"stop_sequences": ["END"], "temperature": 0.2, "max_output_tokens": 32}
    assert results[0].status_code == 200 and content(results[0]) == "echo: gemini «second» turn"
    assert results[0].usage.input_tokens == 2 + 2 + 1 + 3  # system, both user turns, the model turn
    for refused, param in zip(results[1:], ("logit_bias", "stream"), strict=True):
        assert refused.status_code == 400 and refused.body is not None
        assert refused.body["error"]["code"] == "unsupported_parameter" and refused.body["error"]["param"] == param


@pytest.mark.parametrize(("provider", "text", "status", "code"), [
    ("anthropic", "busy #fail:overloaded_error", 503, "overloaded_error"),
    ("anthropic", "bad #fail:invalid_request_error", 400, "invalid_request_error"),
    ("mistral", "slow down #fail:429", 429, "429"),
    ("gemini", "slow down #fail:RESOURCE_EXHAUSTED", 429, "RESOURCE_EXHAUSTED"),
    ("gemini", "bad #fail:INVALID_ARGUMENT", 400, "INVALID_ARGUMENT"),
])
async def test_a_line_error_keeps_the_providers_code(
    provider: str, text: str, status: int, code: str, stubs: dict[str, Stub], store: SQLiteStore
) -> None:
    backend = NativeBatchBackend(route(provider, stubs[provider]), {}, store)
    results = await run_shard(backend, await new_shard(store, 2), [chat(1), chat(2, text)])
    assert results[0].status_code == 200
    failed = results[1]
    assert failed.status_code == status and failed.body is not None, failed
    assert failed.body["error"]["code"] == code and "directive" in failed.body["error"]["message"]
    assert failed.usage.input_tokens == 0  # an error costs nothing


@pytest.mark.parametrize(("provider", "directive", "code", "words"), [
    ("anthropic", "#batch:expire", "expired", "ended with this request expired"),
    ("mistral", "#batch:expire", "timeout_exceeded", "expired"),
    ("mistral", "#batch:fail", "failed", "Job failed (#batch:fail directive)."),
    ("gemini", "#batch:expire", "batch_expired", "expired"),
    ("gemini", "#batch:fail", "upstream_batch_failed", "Batch failed (#batch:fail directive)."),
])
async def test_a_job_that_fails_or_expires_gives_every_line_the_providers_code(
    provider: str, directive: str, code: str, words: str, stubs: dict[str, Stub], store: SQLiteStore
) -> None:
    backend = NativeBatchBackend(route(provider, stubs[provider]), {}, store)
    shard = await new_shard(store, 3)
    results = await run_shard(backend, shard, [chat(1), chat(2, f"poison {directive}"), chat(3)])
    for res in results:
        assert res.status_code is None and res.error is not None, res
        assert res.error["code"] == code and words in res.error["message"], res.error
    summary = await native_route_summary(store, shard.batch_id, ROUTE)
    assert summary["input_tokens"] == 0 and summary["cost_usd"] == 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancel_cancels_the_upstream_job(provider: str, slow_stubs: dict[str, Stub],
                                               store: SQLiteStore) -> None:
    stub = slow_stubs[provider]
    backend = NativeBatchBackend(route(provider, stub), {}, store)
    before = stub.stats().get("cancels", 0)
    (batch_id,), got = await cancelled_mid_poll(backend, store, [chat(1), chat(2)])
    assert got == []
    assert stub.stats()["cancels"] == before + 1
    assert upstream_status(provider, stub, batch_id) in ("canceling", "ended", "CANCELLATION_REQUESTED", "CANCELLED",
                                                         "BATCH_STATE_CANCELLED")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_restart_polls_the_job_it_created(provider: str, slow_stubs: dict[str, Stub], tmp_path: Path) -> None:
    stub = slow_stubs[provider]
    path = tmp_path / "restart.sqlite3"
    first_store = SQLiteStore(path)
    first = NativeBatchBackend(route(provider, stub, native_poll_initial_seconds=0.1), {}, first_store)
    requests = [chat(i) for i in range(1, 5)]
    shard = await new_shard(first_store, len(requests))
    task = asyncio.create_task(anext(first.execute_shard(shard, requests)))
    (batch_id,) = await upstream_ids(first_store, shard)
    created = stub.stats()["batches_created"]
    task.cancel()  # the process goes away mid-poll (a shutdown: our batch is still in progress)
    with pytest.raises(asyncio.CancelledError):
        await task
    await first_store.aclose()
    assert upstream_status(provider, stub, batch_id) in ("in_progress", "QUEUED", "RUNNING", "BATCH_STATE_RUNNING")

    second_store = SQLiteStore(path)  # a new process: new store connection, new backend
    try:
        second = NativeBatchBackend(route(provider, stub, native_poll_initial_seconds=0.1), {}, second_store)
        todo = requests[1:]  # line 1 was recorded before the restart
        results = await run_shard(second, shard, todo)
        assert stub.stats()["batches_created"] == created, "a restart must not create the job again"
        assert [r.custom_id for r in results] == [r.custom_id for r in todo] and all(r.ok for r in results)
        summary = await native_route_summary(second_store, shard.batch_id, ROUTE)
        assert summary["upstream_batch_ids"] == [batch_id]
        assert summary["input_tokens"] == 4 * 5  # every line of the job counts, the one recorded before too
    finally:
        await second_store.aclose()


async def test_mistral_embeddings_and_an_endpoint_a_provider_lacks(stubs: dict[str, Stub],
                                                                   store: SQLiteStore) -> None:
    embed = BatchRequest(line=1, custom_id="e1", url=Endpoint.EMBEDDINGS, body={"model": ROUTE, "input": "a b c"})
    mistral = NativeBatchBackend(route("mistral", stubs["mistral"]), {}, store)
    (res,) = await run_shard(mistral, await new_shard(store, 1), [embed])
    assert res.status_code == 200 and res.body is not None and len(res.body["data"][0]["embedding"]) == 8
    assert res.usage.input_tokens == 3
    anthropic = NativeBatchBackend(route("anthropic", stubs["anthropic"]), {}, store)
    assert anthropic.endpoints == frozenset({Endpoint.CHAT, Endpoint.MESSAGES})
    (res,) = await run_shard(anthropic, await new_shard(store, 1), [embed])
    assert res.status_code == 400 and res.body is not None
    assert res.body["error"]["code"] == "unsupported_endpoint" and "anthropic" in res.body["error"]["message"]


@pytest.mark.parametrize("model", ["perplexity/sonar", "cohere/command-r"])
def test_config_refuses_native_on_a_provider_without_native_batches(model: str) -> None:
    """Never silently run in real time: the entry is named, and the providers that can."""
    raw = {"model_list": [
        {"model_name": "claude-cheap", "litellm_params": {"model": "anthropic/claude-haiku-4-5"},
         "model_info": {"batch_mode": "native"}},
        {"model_name": "llama-cheap", "litellm_params": {"model": model}, "model_info": {"batch_mode": "native"}},
    ]}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "cheap.yaml")
    assert refused.value.key == "model_list[1].model_info"
    assert str(refused.value).startswith("cheap.yaml: model_list[1].model_info: batch_mode: native on 'llama-cheap': ")
    provider = model.partition("/")[0]
    assert f"not {provider}/" in refused.value.problem
    assert f"on {', '.join(sorted(native_declarations()))} deployments" in refused.value.problem
    assert "an openai/ deployment with that host's api_base" in refused.value.problem  # OpenAI-format hosts
    config = parse_config({"model_list": raw["model_list"][:1]}, "cheap.yaml")
    assert config.routes["claude-cheap"].kind is RouteKind.NATIVE


def test_every_provider_the_config_accepts_has_its_jobs() -> None:
    for provider in native_declarations():
        cls = jobs_class(provider)
        assert cls is not None and cls.endpoints and job_limits(provider).max_lines > 0, provider
    assert jobs_class("perplexity") is None


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refused_key_fails_the_lines_with_the_providers_words(provider: str, store: SQLiteStore) -> None:
    with start_stub(MODULES[provider], ["--api-key", "the-right-key"]) as stub:
        backend = NativeBatchBackend(route(provider, stub), {}, store)
        results = await run_shard(backend, await new_shard(store, 2), [chat(1), chat(2)])
    for res in results:
        assert res.error is not None and res.error["code"] == "upstream_batch_failed", res
        # Google answers a wrong key with 400 INVALID_ARGUMENT "API key not valid", the others with 401
        status = "400" if provider == "gemini" else "401"
        assert status in res.error["message"] and "sk-" not in res.error["message"]  # never the key itself


async def test_mistral_job_made_before_a_crash_is_found_by_its_file(stubs: dict[str, Stub],
                                                                   store: SQLiteStore) -> None:
    """The upload was recorded, the job was created, the process died before recording the job: a restart
    finds the job by its input file and polls it; it never creates a second one."""
    import litellm

    stub = stubs["mistral"]
    backend = NativeBatchBackend(route("mistral", stub), {}, store)
    await backend.start()
    requests = [chat(1), chat(2)]
    shard = await new_shard(store, 2)
    jobs, _, _ = backend._deployment(0)
    assert jobs is not None
    kwargs = {"custom_llm_provider": "mistral", "api_base": stub.url, "api_key": "sk-mistral"}
    data = b"".join(jobs.line(r) for r in requests)
    upload = await litellm.acreate_file(file=("in.jsonl", data), purpose="batch", **kwargs)
    job = await litellm.acreate_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                      input_file_id=upload.id, model="mistral/mistral-small-latest", **kwargs)
    await store.backend_state.put(shard_meta_key(shard), {"deployment": 0, "parts": [
        {"endpoint": "/v1/chat/completions", "lines": [1, 2], "file_id": upload.id}]})
    created = stub.stats()["batches_created"]
    results = await run_shard(backend, shard, requests)
    assert stub.stats()["batches_created"] == created
    assert all(r.ok for r in results)
    assert await upstream_ids(store, shard) == [job.id]


@pytest.mark.parametrize(("provider", "status"), [("anthropic", "400 invalid_request_error: requests:"),
                                                  ("mistral", "422 A batch job holds")])
async def test_a_job_over_the_providers_limit_is_refused_in_its_words(
    provider: str, status: str, stubs: dict[str, Stub], store: SQLiteStore
) -> None:
    """The stand-ins hold their provider's limit (here lowered to 3 requests): a route that allows more gets the
    provider's refusal on each line of that job, and nothing is lost or run twice."""
    backend = NativeBatchBackend(route(provider, stubs[provider], native_max_lines=4), {}, store)
    results = await run_shard(backend, await new_shard(store, 4), [chat(i) for i in range(1, 5)])
    for res in results:
        assert res.error is not None and res.error["code"] == "upstream_batch_failed", res
        assert status in res.error["message"] and "at most 3 requests" in res.error["message"], res.error


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancelling_our_batch_cancels_the_providers_job(provider: str, slow_stubs: dict[str, Stub],
                                                               tmp_path: Path) -> None:
    """Through the pipeline: our batch cancelled, the provider's job cancelled, its lines failed, its id kept."""
    stub = slow_stubs[provider]
    batch_id = await cancel_once_submitted(route(provider, stub), tmp_path, lambda i: chat(i).body)
    assert upstream_status(provider, stub, batch_id) in ("canceling", "ended", "CANCELLATION_REQUESTED",
                                                         "CANCELLED", "BATCH_STATE_CANCELLED")


async def test_results_are_read_line_by_line_across_chunks(stubs: dict[str, Stub]) -> None:
    """`http_lines` (how Anthropic's results and Mistral's files are read): lines cut across the network's
    chunks come out whole, multi-byte characters too."""
    import httpx

    lines = [json.dumps({"custom_id": f"l{i}", "body": {"text": "ü✓" * (i % 97)}}).encode() for i in range(20_000)]
    stub = stubs["mistral"]
    auth = {"authorization": "Bearer sk-mistral"}
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{stub.url}/v1/files", headers=auth, data={"purpose": "batch"},
                                  files={"file": ("big.jsonl", b"\n".join(lines) + b"\n")})
    file_id = reply.json()["id"]
    got = [line async for line in http_lines(f"{stub.url}/v1/files/{file_id}/content", auth, 10)]
    assert got == lines
    with pytest.raises(UpstreamHTTPError) as missing:
        _ = [line async for line in http_lines(f"{stub.url}/v1/files/nope/content", auth, 10)]
    assert missing.value.status_code == 404 and "nope not found" in missing.value.message
