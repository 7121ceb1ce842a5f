"""A Message Batch through the front door (the `anthropic` SDK unmodified) on the route kinds a server runs
without an engine: a native Anthropic route (Anthropic's own Message Batches, its loopback stand-in), a
real-time `anthropic/` deployment, an upstream OpenAI-wire route (LiteLLM's Anthropic-messages adapter), in
one batch. Each request comes back once, as the SDK's result: succeeded with an Anthropic `message`, or
errored with Anthropic's error. (The local route, with the tiny Llama, is tests/engine/.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic

from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream
from tests.servers.test_anthropic_batches import ended, request, results
from tests.support.server_helpers import Gateway, start_gateway

KEY = "sk-alpha-0123456789"
ROUTES = ["claude-batch", "claude-now", "gpt"]


@pytest.fixture(scope="module")
def claude() -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.3"])
    yield stub
    stub.stop()


def routes_config(up: Upstream, claude: Stub) -> dict[str, Any]:
    native = {"batch_mode": "native", "native_poll_max_seconds": 0.2}
    haiku = {"model": "anthropic/claude-haiku-4-5", "api_key": "sk-ant", "api_base": claude.url}
    return {
        "model_list": [
            {"model_name": "claude-batch", "litellm_params": haiku, "model_info": native},
            {"model_name": "claude-now", "litellm_params": haiku},
            {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-test",
                                                     "api_base": up.v1_url}},
        ],
        "router_settings": {"num_retries": 0, "timeout": 30},
        "batch_settings": {"teams": [{"team_id": "alpha", "api_keys": [KEY]}]},
    }


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, claude: Stub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with start_gateway(routes_config(upstream, claude), tmp_path_factory.mktemp("routes") / "data") as server:
        yield server


def test_native_anthropic_route(gateway: Gateway, claude: Stub) -> None:
    """Requests on a native route go to Anthropic's own Message Batches as they are; each comes back as
    the message Anthropic gave."""
    client = Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)
    before = claude.stats()
    created = client.messages.batches.create(
        requests=[request(f"n{i}", f"native {i}", model="claude-batch") for i in range(4)])  # type: ignore[misc]
    batch = ended(client, created.id)
    assert batch.request_counts.succeeded == 4, batch
    got = results(client, batch.id)
    assert list(got) == [f"n{i}" for i in range(4)]
    for result in got.values():
        assert result.type == "succeeded" and result.message.type == "message"
        assert result.message.model == "claude-haiku-4-5"
    assert claude.stats() != before  # the stand-in ran them


def test_one_batch_over_every_route(gateway: Gateway) -> None:
    """One batch spread by `params.model` over a native, a real-time Anthropic and an upstream route (and a
    request for no route): each request once, in input order, each answer an Anthropic result."""
    client = Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)
    reqs = [request(f"q{i}", f"question {i}", model=ROUTES[i % len(ROUTES)]) for i in range(9)]
    reqs.append(request("lost", "no route", model="nowhere"))
    created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    batch = ended(client, created.id)
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (9, 1), batch
    got = results(client, batch.id)
    assert list(got) == [r["custom_id"] for r in reqs]
    for i in range(9):
        result = got[f"q{i}"]
        assert result.type == "succeeded" and result.message.type == "message", (ROUTES[i % 3], result)
        assert result.message.content and result.message.usage.output_tokens >= 0
    assert got["lost"].type == "errored" and got["lost"].error.error.type == "invalid_request_error"

