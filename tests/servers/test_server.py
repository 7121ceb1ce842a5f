"""The HTTP front door, end to end: a real `batchyard` server process, the real
`openai` SDK (OpenAI and AzureOpenAI forms) and LiteLLM as clients, and the
loopback upstream (tests/fakes/upstream/server.py) behind it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AzureOpenAI, OpenAI

from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.loops import run_apart
from tests.support.server_helpers import (
    API_VERSION,
    Gateway,
    chat_line,
    gateway_config,
    jsonl,
    read_jsonl,
    start_gateway,
    submit,
    wait_batch,
)
from tests.support.team_gateway import (
    ALL_MODELS,
    ALPHA,
    ALPHA_MODELS,
    BETA,
    GAMMA,
    MASTER,
    alpha,
    assert_error,
    beta,
    gw,
    upstream,
)
from tests.support.waiting import eventually

__all__ = ["alpha", "beta", "gw", "upstream"]  # fixtures, used by name


def _ids(lines: list[dict[str, Any]]) -> list[str]:
    return [line["custom_id"] for line in lines]


# --------------------------------------------------------------------------- the lifecycle, per client family


def test_lifecycle_mixed_models_and_url_forms(alpha: OpenAI) -> None:
    lines = [
        chat_line("c1", "gpt-mini", "hello one"),
        chat_line("c2", "gpt-azure", "hello two", url="/chat/completions"),
        chat_line("c3", None, "hello three", url="/openai/deployments/gpt-azure/chat/completions"),
        chat_line("c4", "gpt-mini", "#fail:400 four", url="chat/completions"),
        chat_line("c5", "gpt-azure", "hello five", url="/openai/v1/chat/completions"),
        chat_line("c6", "gpt-mini", "hello six"),
    ]
    created = submit(alpha, lines, metadata={"job": "lifecycle"})
    assert created.status == "validating"
    assert created.metadata == {"job": "lifecycle"}
    assert created.endpoint == "/v1/chat/completions"
    batch = wait_batch(alpha, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 5, 1)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.usage is not None and batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    routes = (batch.model_extra or {})["routes"]  # our per-route breakdown, beside OpenAI's fields
    assert {name: (r["requests"], r["completed"], r["failed"]) for name, r in routes.items()} == {
        "gpt-mini": (3, 2, 1), "gpt-azure": (3, 3, 0)}
    assert sum(r["input_tokens"] for r in routes.values()) == batch.usage.input_tokens
    assert sum(r["output_tokens"] for r in routes.values()) == batch.usage.output_tokens

    output = read_jsonl(alpha, batch.output_file_id)
    assert _ids(output) == ["c1", "c2", "c3", "c5", "c6"]  # input order
    texts = {"c1": "one", "c2": "two", "c3": "three", "c5": "five", "c6": "six"}
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] == f"echo: hello {texts[line['custom_id']]}"
    errors = read_jsonl(alpha, batch.error_file_id)
    assert _ids(errors) == ["c4"]
    assert errors[0]["response"]["status_code"] == 400
    assert "error" in errors[0]["response"]["body"]

    assert batch.output_file_id is not None
    out_file = alpha.files.retrieve(batch.output_file_id)
    assert out_file.purpose == "batch_output"
    assert out_file.bytes == len(alpha.files.content(batch.output_file_id).content)
    assert batch.output_file_id in {f.id for f in alpha.files.list(purpose="batch_output")}
    with pytest.raises(openai.ConflictError):
        alpha.batches.cancel(batch.id)


def test_azure_client_forms(gw: Gateway) -> None:
    azure = AzureOpenAI(azure_endpoint=gw.url, api_key=BETA, api_version=API_VERSION, max_retries=0)
    lines = [chat_line(f"az{i}", "gpt-azure", f"azure {i}", url="/chat/completions") for i in range(3)]
    created = submit(azure, lines, endpoint="/chat/completions")  # type: ignore[arg-type]
    batch = wait_batch(azure, created.id)  # type: ignore[arg-type]
    assert batch.status == "completed", batch
    assert _ids(read_jsonl(azure, batch.output_file_id)) == ["az0", "az1", "az2"]  # type: ignore[arg-type]

    # Azure's v1 form and LiteLLM's /azure/v1 form see the same team's objects
    for prefix in ("/openai/v1", "/azure/v1"):
        client = gw.client(BETA, prefix=prefix)
        assert client.batches.retrieve(batch.id).status == "completed"
        assert batch.input_file_id in {f.id for f in client.files.list()}
    raw = gw.http("GET", f"/openai/batches/{batch.id}?api-version={API_VERSION}", headers={"api-key": BETA})
    assert raw.status_code == 200 and raw.json()["id"] == batch.id


@pytest.mark.filterwarnings("ignore:coroutine 'OpenAIFilesAPI.afile_content' was never awaited")
def test_litellm_client(gw: Gateway) -> None:
    import litellm

    common: dict[str, Any] = {"custom_llm_provider": "openai", "api_base": gw.url + "/v1", "api_key": BETA}

    async def flow() -> tuple[Any, bytes]:
        lines = [chat_line(f"ll{i}", "gpt-mini", f"litellm {i}") for i in range(3)]
        file = await litellm.acreate_file(file=("in.jsonl", jsonl(lines)), purpose="batch", **common)
        batch = await litellm.acreate_batch(
            completion_window="24h", endpoint="/v1/chat/completions", input_file_id=file.id, **common
        )
        deadline = time.monotonic() + 60
        while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            batch = await litellm.aretrieve_batch(batch_id=batch.id, **common)
        content = await litellm.afile_content(file_id=batch.output_file_id, **common)
        return batch, content.content

    batch, content = run_apart(flow())
    assert batch.status == "completed"
    assert [json.loads(x)["custom_id"] for x in content.splitlines()] == ["ll0", "ll1", "ll2"]


# --------------------------------------------------------------------------- lists, cancel, expiry


def test_pagination(gw: Gateway) -> None:
    gamma = gw.client(GAMMA)
    uploaded = [
        gamma.files.create(file=(f"p{i}.jsonl", jsonl([chat_line("x", "gpt-mini", "p")])), purpose="batch")
        for i in range(5)
    ]
    first = gw.http("GET", "/v1/files?limit=2", GAMMA).json()
    assert first["object"] == "list" and len(first["data"]) == 2 and first["has_more"] is True
    assert first["first_id"] == first["data"][0]["id"] and first["last_id"] == first["data"][1]["id"]
    seen = [f.id for f in gamma.files.list(limit=2)]  # the SDK follows `after` through every page
    assert sorted(seen) == sorted(f.id for f in uploaded)
    assert [f.id for f in gamma.files.list(order="asc")] == seen[::-1]

    batches = [
        gamma.batches.create(input_file_id=uploaded[0].id, endpoint="/v1/chat/completions", completion_window="24h")
        for _ in range(5)
    ]
    page = gw.http("GET", "/v1/batches?limit=2", GAMMA).json()
    assert set(page) == {"object", "data", "first_id", "last_id", "has_more"}
    assert len(page["data"]) == 2 and page["has_more"] is True and page["first_id"] == batches[-1].id
    rest = gw.http("GET", f"/v1/batches?limit=100&after={page['last_id']}", GAMMA).json()
    assert rest["has_more"] is False
    assert [b["id"] for b in page["data"] + rest["data"]] == [b.id for b in reversed(batches)]
    for bad in ("0", "101"):
        assert_error(gw.http("GET", f"/v1/batches?limit={bad}", GAMMA), 400)
    assert_error(gw.http("GET", "/v1/files?order=sideways", GAMMA), 400)
    assert_error(gw.http("GET", "/v1/batches?limit=many", GAMMA), 400, "invalid_type")
    for b in batches:
        wait_batch(gamma, b.id)


def test_cancel_keeps_finished_results(beta: OpenAI) -> None:
    lines = [chat_line("fast0", "gpt-mini", "quick"), chat_line("fast1", "gpt-mini", "quick too")]
    lines += [chat_line(f"slow{i}", "gpt-mini", f"#sleep:20000 slow {i}") for i in range(3)]
    created = submit(beta, lines)
    eventually(lambda: beta.batches.retrieve(created.id).request_counts.completed >= 2,  # type: ignore[union-attr]
               30, "two lines done", interval=0.1)
    cancelling = beta.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_batch(beta, created.id, timeout=30)
    assert batch.status == "cancelled" and batch.cancelled_at
    output, errors = read_jsonl(beta, batch.output_file_id), read_jsonl(beta, batch.error_file_id)
    assert _ids(output) == ["fast0", "fast1"]
    assert sorted(_ids(errors)) == ["slow0", "slow1", "slow2"]
    assert all(e["response"] is None and e["error"]["code"] for e in errors)


def test_expiry_keeps_finished_results(beta: OpenAI) -> None:
    lines = [chat_line("early0", "gpt-mini", "in time"), chat_line("early1", "gpt-mini", "in time too")]
    lines += [chat_line(f"late{i}", "gpt-mini", f"#sleep:20000 late {i}") for i in range(3)]
    created = submit(beta, lines, completion_window="4s")
    assert created.expires_at is not None and created.expires_at - created.created_at == 4
    batch = wait_batch(beta, created.id, timeout=30)
    assert batch.status == "expired" and batch.expired_at
    assert _ids(read_jsonl(beta, batch.output_file_id)) == ["early0", "early1"]
    errors = read_jsonl(beta, batch.error_file_id)
    assert _ids(errors) == ["late0", "late1", "late2"]
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)


def test_cancel_finished_is_409(beta: OpenAI) -> None:
    failed = wait_batch(beta, submit(beta, ["{oops"]).id)
    assert failed.status == "failed"
    with pytest.raises(openai.ConflictError) as info:
        beta.batches.cancel(failed.id)
    assert info.value.response.json()["error"]["message"]


# --------------------------------------------------------------------------- tenants and keys


@pytest.mark.parametrize("other_key", [BETA, MASTER])
def test_tenant_isolation(gw: Gateway, alpha: OpenAI, other_key: str) -> None:
    batch = wait_batch(alpha, submit(alpha, [chat_line("t1", "gpt-mini", "mine")]).id)
    assert batch.output_file_id is not None
    owned_files = [batch.input_file_id, batch.output_file_id]
    other = gw.client(other_key)
    azure = AzureOpenAI(azure_endpoint=gw.url, api_key=other_key, api_version=API_VERSION, max_retries=0)
    for client in (other, azure):
        for file_id in owned_files:
            for call in (client.files.retrieve, client.files.content, client.files.delete):
                with pytest.raises(openai.NotFoundError):
                    call(file_id)
            with pytest.raises(openai.NotFoundError):
                client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        for call in (client.batches.retrieve, client.batches.cancel):  # type: ignore[assignment]
            with pytest.raises(openai.NotFoundError):
                call(batch.id)
    for path in (f"/v1/files/{batch.input_file_id}", f"/v1/batches/{batch.id}"):
        assert_error(gw.http("GET", path, other_key), 404)
    assert not set(owned_files) & {f.id for f in other.files.list()}
    assert batch.id not in {b.id for b in other.batches.list(limit=100)}
    # still there for its owner
    assert alpha.files.retrieve(batch.input_file_id).id == batch.input_file_id
    assert alpha.batches.retrieve(batch.id).status == "completed"


def test_auth_errors(gw: Gateway) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer sk-wrong-key"},
        {"api-key": "sk-wrong-key"},
        {"Authorization": f"Basic {ALPHA}"},
    ):
        for path in ("/v1/files", "/openai/batches", "/openai/v1/models", "/azure/v1/batches"):
            assert_error(gw.http("GET", path, headers=headers), 401)
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-wrong-key").files.list()
    with pytest.raises(openai.AuthenticationError):
        AzureOpenAI(azure_endpoint=gw.url, api_key="sk-wrong-key", api_version=API_VERSION).batches.list()
    assert gw.http("GET", "/health").json()["status"] == "healthy"
    assert gw.http("GET", "/health/readiness").status_code == 200


def test_models_per_caller(gw: Gateway) -> None:
    assert [m.id for m in gw.client(ALPHA).models.list()] == ALPHA_MODELS
    for key in (BETA, MASTER):
        models = gw.client(key).models.list().data
        assert [m.id for m in models] == ALL_MODELS
        assert all(m.object == "model" and m.owned_by == "batchyard" and m.created > 0 for m in models)



def test_open_when_no_keys(upstream: Upstream, tmp_path: Path) -> None:
    with start_gateway(gateway_config(upstream), tmp_path / "open") as gw:
        assert "API is open" in gw.log()
        line = chat_line("ok1", "gpt-mini", "fine 1")
        file = gw.client(None).files.create(file=("o.jsonl", jsonl([line])), purpose="batch")
        assert gw.client("anything").files.retrieve(file.id).id == file.id
        assert gw.http("GET", "/v1/files").json()["data"][0]["id"] == file.id
        assert [m.id for m in gw.client(None).models.list()] == ALL_MODELS


def test_sigkill_and_restart_resumes(tmp_path: Path) -> None:
    total = 40
    with start_upstream() as upstream:
        config = gateway_config(upstream, models=["gpt-mini"], max_concurrency=4, shard_size=10)
        data_dir = tmp_path / "data"
        texts = [f"#count #sleep:250 line {i}" for i in range(total)]
        lines = [chat_line(f"r{i:02d}", "gpt-mini", text) for i, text in enumerate(texts)]
        gw = start_gateway(config, data_dir)
        try:
            client = gw.client(None)
            batch = submit(client, lines)
            def completed() -> int:
                counts = client.batches.retrieve(batch.id).request_counts
                return counts.completed if counts is not None and counts.completed >= 8 else 0

            done = eventually(completed, 60, "eight lines done", detail=gw.log)
            gw.kill()
        finally:
            gw.kill()
        assert done < total, "the batch finished before the kill; slow the lines down"

        with start_gateway(config, data_dir) as again:
            client = again.client(None)
            finished = wait_batch(client, batch.id, timeout=120)
            assert finished.status == "completed", finished
            assert finished.request_counts is not None and finished.request_counts.completed == total
            output = read_jsonl(client, finished.output_file_id)
            assert _ids(output) == [line["custom_id"] for line in lines]  # each exactly once, in input order
            assert read_jsonl(client, finished.error_file_id) == []
            assert again.stop() in (0, -15), again.log()

        calls = upstream.stats()["by_custom"]
        assert all(calls.get(text, 0) >= 1 for text in texts)
        resent = sum(calls[text] - 1 for text in texts)
        assert resent <= total - done, calls  # what was recorded before the kill was not sent again


# --------------------------------------------------------------------------- the openai SDK's 2.x line

_OPENAI2_CLIENT = r"""
import json, sys, time
import openai
from openai import OpenAI
assert openai.__version__.startswith("2."), openai.__version__
base, key, model = sys.argv[1:4]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
line = {"custom_id": "o2", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hello from 2.x"}]}}
f = client.files.create(file=("b.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
deadline = time.monotonic() + 60
while b.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
    time.sleep(0.2)
    b = client.batches.retrieve(b.id)
out = client.files.content(b.output_file_id).text if b.output_file_id else ""
print(json.dumps({"version": openai.__version__, "status": b.status, "output": out}))
"""


def test_openai_sdk_2x_still_works(gw: Gateway, tmp_path: Path) -> None:
    """The locks carry the 3.x SDK; teams still on 2.x upload, create, poll and download unchanged.

    scripts/test.sh installs openai 2.x (requirements/openai2.lock) into its own folder, first on the
    client subprocess's path."""
    import os
    import subprocess
    import sys

    folder = os.environ.get("BATCHYARD_OPENAI2", "")
    if not folder or not Path(folder, "openai").is_dir():
        if os.environ.get("CI"):
            pytest.fail("BATCHYARD_OPENAI2 (openai 2.x, installed by scripts/test.sh) is missing")
        pytest.skip("openai 2.x is installed by scripts/test.sh (BATCHYARD_OPENAI2)")
    script = tmp_path / "client2.py"
    script.write_text(_OPENAI2_CLIENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(script), gw.url + "/v1", ALPHA, "gpt-mini"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["version"] == "2.54.0" and result["status"] == "completed"
    (row,) = [json.loads(x) for x in result["output"].splitlines()]
    assert row["custom_id"] == "o2" and row["response"]["status_code"] == 200
