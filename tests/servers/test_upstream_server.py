"""The loopback OpenAI/Azure stand-in (tests/fakes/upstream/server.py), checked with the real `openai` SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import AzureOpenAI, OpenAI

from tests.fakes.upstream.server import Upstream, embedding_vector, start_upstream

API_VERSION = "2024-10-21"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(batch_delay=0.3) as server:
        yield server


@pytest.fixture(scope="module")
def client(upstream: Upstream) -> OpenAI:
    return OpenAI(base_url=upstream.v1_url, api_key=upstream.api_key, max_retries=2)


@pytest.fixture(scope="module")
def azure(upstream: Upstream) -> AzureOpenAI:
    return AzureOpenAI(azure_endpoint=upstream.url, api_key=upstream.api_key, api_version=API_VERSION, max_retries=2)


def _jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _read_jsonl(client: OpenAI, file_id: str | None) -> list[dict]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def _wait(client: OpenAI, batch_id: str, timeout: float = 5.0) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled") or time.monotonic() > deadline:
            return batch
        time.sleep(0.05)


def test_chat_completions_and_responses(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there world"}],
    )
    assert reply.model == "gpt-test"
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == "echo: hello there world"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (5, 4, 9)

    completion = client.completions.create(model="gpt-test-instruct", prompt="say this")
    assert completion.choices[0].text == "echo: say this"
    assert completion.usage is not None and completion.usage.total_tokens == 5

    response = client.responses.create(model="gpt-test", input="hi there")
    assert response.object == "response"
    assert response.output_text == "echo: hi there"
    assert response.usage is not None and response.usage.input_tokens == 2 and response.usage.output_tokens == 3


def test_chat_streaming(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: stream me"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 5


def test_embeddings_float_and_base64(client: OpenAI) -> None:
    as_floats = client.embeddings.create(model="emb-test", input=["a b", "c"], encoding_format="float")
    as_base64 = client.embeddings.create(model="emb-test", input=["a b", "c"])  # the SDK asks for base64
    assert [d.embedding for d in as_floats.data] == [d.embedding for d in as_base64.data]
    assert as_floats.data[0].embedding == embedding_vector("a b")
    assert len(as_floats.data[1].embedding) == 8
    assert as_floats.usage.prompt_tokens == 3


def test_azure_deployments_and_v1(upstream: Upstream, azure: AzureOpenAI) -> None:
    reply = azure.chat.completions.create(model="my-gpt4o", messages=[{"role": "user", "content": "from azure"}])
    assert reply.model == "my-gpt4o"
    assert reply.choices[0].message.content == "echo: from azure"
    vectors = azure.embeddings.create(model="my-embedder", input="x")
    assert vectors.model == "my-embedder" and len(vectors.data[0].embedding) == 8

    v1 = OpenAI(base_url=f"{upstream.url}/openai/v1", api_key=upstream.api_key)
    assert v1.completions.create(model="dep", prompt="p q").choices[0].text == "echo: p q"
    by_path = upstream.stats()["by_path"]
    assert by_path["/openai/deployments/my-gpt4o/chat/completions"] >= 1
    assert by_path["/openai/v1/completions"] >= 1


def test_rerank(upstream: Upstream) -> None:
    body = {"model": "rr", "query": "red apple", "documents": ["blue sky", "red apple pie", "apple"], "top_n": 2}
    reply = httpx.post(f"{upstream.v1_url}/rerank", json=body).json()
    assert [r["index"] for r in reply["results"]] == [1, 2]
    assert reply["results"][0]["relevance_score"] > reply["results"][1]["relevance_score"] > 0


def test_429_twice_then_success(upstream: Upstream, client: OpenAI) -> None:
    text = "retry me #fail:429x2 #count"
    reply = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": text}])
    assert reply.choices[0].message.content == f"echo: {text}"
    stats = upstream.stats()
    assert stats["by_custom"][text] == 3
    assert stats["by_status"]["429"] >= 2


def test_injected_errors(upstream: Upstream, client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "no #fail:400"}])
    assert info.value.status_code == 400
    assert info.value.body == {
        "message": "Injected failure 400 (#fail directive).",
        "type": "invalid_request_error",
        "param": None,
        "code": "bad_request",
    }
    flaky = "once #fail:500x1 #count"
    assert client.completions.create(model="m", prompt=flaky).choices[0].text == f"echo: {flaky}"
    assert upstream.stats()["by_custom"][flaky] == 2
    with pytest.raises(openai.InternalServerError):
        client.with_options(max_retries=0).completions.create(model="m", prompt="down #fail:500")


def test_api_key_required() -> None:
    with start_upstream(api_key="sekret") as server:
        good = OpenAI(base_url=server.v1_url, api_key="sekret")
        assert good.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]).model == "m"
        azure = AzureOpenAI(azure_endpoint=server.url, api_key="sekret", api_version=API_VERSION)
        assert azure.embeddings.create(model="d", input="x").model == "d"
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=server.v1_url, api_key="wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            AzureOpenAI(azure_endpoint=server.url, api_key="wrong", api_version=API_VERSION).files.list()


def test_openai_batch_lifecycle(upstream: Upstream, client: OpenAI) -> None:
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i, body in enumerate(
            [
                {"model": "gpt-test", "messages": [{"role": "user", "content": "one"}]},
                {"model": "gpt-test", "messages": [{"role": "user", "content": "two #fail:400"}]},
                {"model": "gpt-test", "messages": [{"role": "user", "content": "three four"}]},
            ]
        )
    ]
    before = upstream.stats()["batches_created"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.status) == ("file", "batch", "processed")
    assert client.files.retrieve(uploaded.id).bytes == len(_jsonl(lines))

    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"k": "v"}
    )
    assert batch.status == "validating" and batch.metadata == {"k": "v"}
    done = _wait(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 2, 1)
    assert done.model == "gpt-test" and done.completed_at and done.in_progress_at

    output = _read_jsonl(client, done.output_file_id)
    assert [o["custom_id"] for o in output] == ["r0", "r2"]
    assert output[0]["response"]["status_code"] == 200 and output[0]["error"] is None
    assert output[1]["response"]["body"]["choices"][0]["message"]["content"] == "echo: three four"
    errors = _read_jsonl(client, done.error_file_id)
    assert errors[0]["custom_id"] == "r1" and errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["code"] == "bad_request"

    assert upstream.stats()["batches_created"] == before + 1
    assert any(b.id == batch.id for b in client.batches.list(limit=5).data)
    with pytest.raises(openai.ConflictError):  # the SDK retries 409s by default
        client.with_options(max_retries=0).batches.cancel(batch.id)
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_azure_batch_lifecycle(azure: AzureOpenAI) -> None:
    lines = [
        {
            "custom_id": f"a{i}",
            "method": "POST",
            "url": "/chat/completions",
            "body": {"model": "my-gpt4o", "messages": [{"role": "user", "content": f"azure {i}"}]},
        }
        for i in range(2)
    ]
    uploaded = azure.files.create(file=("az.jsonl", _jsonl(lines)), purpose="batch")
    batch = azure.batches.create(input_file_id=uploaded.id, endpoint="/chat/completions", completion_window="24h")  # type: ignore[arg-type]
    done = _wait(azure, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    output = _read_jsonl(azure, done.output_file_id)
    assert [o["response"]["body"]["model"] for o in output] == ["my-gpt4o", "my-gpt4o"]


def test_batch_validation_and_directives(client: OpenAI) -> None:
    def upload(lines: list[dict]) -> str:
        return client.files.create(file=("x.jsonl", _jsonl(lines)), purpose="batch").id

    def line(i: int, text: str, url: str = "/v1/chat/completions", model: str = "gpt-test") -> dict:
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        return {"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}

    def start(lines: list[dict]) -> openai.types.Batch:
        return client.batches.create(
            input_file_id=upload(lines), endpoint="/v1/chat/completions", completion_window="24h"
        )

    with pytest.raises(openai.BadRequestError) as info:
        start([line(0, "a"), line(1, "b", url="/v1/embeddings")])
    assert info.value.code == "invalid_url"
    with pytest.raises(openai.BadRequestError) as info:
        start([line(0, "a"), line(1, "b", model="other")])
    assert info.value.code == "mismatched_model"
    with pytest.raises(openai.BadRequestError) as info:
        start([line(0, "a"), line(0, "b")])
    assert info.value.code == "duplicate_custom_id"

    failed = start([line(0, "x #batch:fail")])
    expired = start([line(0, "x #batch:expire")])
    cancelled = client.batches.cancel(start([line(0, "y")]).id)
    assert cancelled.status == "cancelling"

    failed_done = _wait(client, failed.id)
    assert failed_done.status == "failed" and failed_done.errors and failed_done.errors.data
    assert failed_done.errors.data[0].line == 1
    expired_done = _wait(client, expired.id)
    assert expired_done.status == "expired"
    assert _read_jsonl(client, expired_done.error_file_id)[0]["error"]["code"] == "batch_expired"
    cancelled_done = _wait(client, cancelled.id)
    assert cancelled_done.status == "cancelled" and cancelled_done.cancelled_at


def test_reset(upstream: Upstream, client: OpenAI) -> None:
    client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "before reset"}])
    assert upstream.stats()["requests"] > 0
    upstream.reset()
    stats = upstream.stats()
    assert stats["requests"] == 0 and stats["by_custom"] == {} and stats["batches_created"] == 0


def test_moderations_and_images(client: OpenAI, azure: AzureOpenAI) -> None:
    moderation = client.moderations.create(model="omni-moderation-latest", input=["a calm day", "attack at dawn"])
    assert [r.flagged for r in moderation.results] == [False, True]
    assert moderation.results[1].categories.violence is True
    images = client.images.generate(model="gpt-image-1", prompt="a red cat", n=2)
    assert images.data is not None and len(images.data) == 2
    assert all(d.b64_json and d.revised_prompt == "a red cat" for d in images.data)
    assert images.usage is not None and images.usage.input_tokens == 3
    by_url = azure.images.generate(model="painter", prompt="a blue dog", response_format="url")
    assert by_url.data is not None and by_url.data[0].url and by_url.data[0].url.startswith("https://")
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(model="gpt-image-1", prompt="too many", n=11)
    assert info.value.body is not None and info.value.body["param"] == "n"  # type: ignore[index]
