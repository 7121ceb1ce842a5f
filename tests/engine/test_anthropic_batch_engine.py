"""A Message Batch through the front door (the `anthropic` SDK unmodified) on a local route (vLLM's own
Anthropic serving layer on the tiny Llama), and one batch that mixes a local, an upstream (the loopback
upstream, LiteLLM's Anthropic-messages adapter) and a native Anthropic route (its loopback stand-in).
One gateway with one engine for the module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic

from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream
from tests.servers.test_anthropic_batches import ended, request, results
from tests.support.engine_helpers import ENGINE_MARKS, built_tiny_models
from tests.support.server_helpers import Gateway, start_gateway

pytestmark = ENGINE_MARKS
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

KEY = "sk-alpha-0123456789"
SLOW = 300  # seconds: a loaded 2-core machine loads the engine and runs a batch slowly
ROUTES = ["tiny", "gpt", "claude-batch"]


@pytest.fixture(scope="module")
def claude() -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.3"])
    yield stub
    stub.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, claude: Stub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = built_tiny_models(tmp_path_factory)
    engine_args = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}
    config: dict[str, Any] = {
        "model_list": [
            {"model_name": "tiny", "litellm_params": {"model": f"vllm/{models.llama}"}, "engine_args": engine_args},
            {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-test",
                                                     "api_base": upstream.v1_url}},
            {"model_name": "claude-batch", "litellm_params": {"model": "anthropic/claude-haiku-4-5",
                                                              "api_key": "sk-ant", "api_base": claude.url},
             "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2}},
        ],
        "router_settings": {"num_retries": 0, "timeout": 30},
        "batch_settings": {"teams": [{"team_id": "alpha", "api_keys": [KEY]}]},
    }
    with start_gateway(config, tmp_path_factory.mktemp("anthropic-engine") / "data") as server:
        yield server


def test_local_route(gateway: Gateway) -> None:
    """Requests on the local route come back as Anthropic messages from vLLM's Anthropic serving layer;
    one the route cannot honour is `errored` with invalid_request_error, and the batch goes on."""
    client = Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=60)
    reqs = [request(f"l{i}", f"Hello number {i}", model="tiny", max_tokens=4) for i in range(3)]
    reqs.append(request("bad", "hi", model="tiny", stream=True))
    created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    batch = ended(client, created.id, timeout=SLOW)
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (3, 1), gateway.log()[-3000:]
    got = results(client, batch.id)
    assert list(got) == [r["custom_id"] for r in reqs]
    for i in range(3):
        result = got[f"l{i}"]
        assert result.type == "succeeded" and result.message.type == "message" and result.message.role == "assistant"
        assert result.message.usage.output_tokens >= 1
    assert got["bad"].type == "errored" and got["bad"].error.error.type == "invalid_request_error"


def test_one_batch_mixes_local_upstream_and_native(gateway: Gateway) -> None:
    """One batch spread by `params.model` over the three route kinds: each request once, in input order,
    each a succeeded Anthropic message."""
    client = Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=60)
    reqs = [request(f"m{i}", f"mixed {i}", model=ROUTES[i % 3], max_tokens=4) for i in range(9)]
    created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    batch = ended(client, created.id, timeout=SLOW)
    assert batch.request_counts.succeeded == 9, (batch, gateway.log()[-3000:])
    got = results(client, batch.id)
    assert list(got) == [r["custom_id"] for r in reqs]
    assert all(r.type == "succeeded" and r.message.type == "message" for r in got.values())
