"""LiteLLM's completion path retries what a retry may fix, once per `num_retries`, and nothing else.

The lines go to a `groq/` deployment (LiteLLM translates its replies, so it takes the completion path, not the
pass-through) on the loopback upstream, which counts the requests each exact text makes (`#count`). A reply
LiteLLM cannot map is the case no retry fixes: the pinned LiteLLM's groq path fails on a 200 without a
`service_tier` (`'ModelResponse' object has no attribute 'service_tier'`; `#tier:NAME` adds one). Its Router
sent such a line `num_retries` more times, each one answered and paid for.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint, Result
from providers.litellm_backend import LiteLLMBackend
from tests.fakes.upstream.server import Upstream


async def _run(entries: list[dict[str, Any]], texts: Sequence[str], retries: int = 3) -> list[Result]:
    routes = list(parse_config({"model_list": entries}).routes.values())
    backend = LiteLLMBackend(routes, {"num_retries": retries, "retry_after": 0}, 8)
    requests = [BatchRequest(line=i + 1, custom_id=f"c{i}", url=Endpoint.CHAT,
                             body={"model": entries[0]["model_name"], "messages": [{"role": "user", "content": text}]})
                for i, text in enumerate(texts)]
    try:
        return sorted([r async for r in backend.execute(requests)], key=lambda r: r.line)
    finally:
        await backend.aclose()


def _groq(upstream: Upstream) -> list[dict[str, Any]]:
    return [{"model_name": "fast", "litellm_params": {"model": "groq/llama-3.1-8b-instant", "api_key": "gsk-test",
                                                       "api_base": upstream.v1_url}}]


@pytest.mark.asyncio
async def test_a_reply_litellm_cannot_map_is_sent_once(upstream: Upstream) -> None:
    upstream.reset()
    unmappable, flaky, bad = "map me #count", "flaky #count #fail:500x1 #tier:default", "bad #count #fail:400"
    results = await _run(_groq(upstream), [unmappable, flaky, bad])
    counts = upstream.stats()["by_custom"]
    # no retry fixes a reply LiteLLM fails to map: one request, and LiteLLM's words with the provider's name
    assert counts[unmappable] == 1, counts
    error = results[0].body["error"] if results[0].body else {}
    assert results[0].status_code == 500 and error["code"] == "upstream_error", results[0]
    assert error["provider"] == "groq" and error["exception"] == "APIConnectionError"
    assert error["message"].startswith("groq: ") and "service_tier" in error["message"], error
    # a 500 is worth another try, as the Router's num_retries says: answered on the second
    assert counts[flaky] == 2 and results[1].status_code == 200, (counts, results[1])
    # a 400 is the line's answer, by LiteLLM's own rule: one request, the provider's status kept
    assert counts[bad] == 1 and results[2].status_code == 400, (counts, results[2])


@pytest.mark.asyncio
async def test_a_credential_file_litellm_cannot_read_is_tried_once(upstream: Upstream) -> None:
    """LiteLLM's Router waits between its retries (0.5 s doubling): three retries of a file that is not there
    took ~4 s. Tried once, the line fails at once."""
    entries = [{"model_name": "gem", "litellm_params": {
        "model": "vertex_ai/gemini-2.0-flash", "vertex_credentials": "/nonexistent/creds.json",
        "vertex_project": "p", "vertex_location": "us-central1"}}]
    started = time.monotonic()
    [result] = await _run(entries, ["hello"], retries=3)
    assert time.monotonic() - started < 3.0
    error = result.body["error"] if result.body else {}
    assert result.status_code == 500 and error["provider"] == "vertex_ai", result
    assert error["code"] == "upstream_error" and "credentials" in error["message"]


@pytest.mark.asyncio
async def test_an_unreachable_host_is_said_unreachable(upstream: Upstream) -> None:
    """No bytes came back (a refused connection): upstream_unreachable, after the Router's retries."""
    entries = [{"model_name": "fast", "litellm_params": {"model": "groq/llama-3.1-8b-instant", "api_key": "gsk-test",
                                                         "api_base": "http://127.0.0.1:9/v1"}}]
    [result] = await _run(entries, ["hello"], retries=1)
    assert result.status_code is None or result.status_code >= 500
    assert result.error is not None and result.error.get("code") == "upstream_unreachable", result


@pytest.mark.asyncio
async def test_a_deployment_s_own_num_retries_counts(upstream: Upstream) -> None:
    """A deployment's `num_retries` (litellm_params) wins over the Router's, as in LiteLLM: two retries with the
    Router's at 0, and still one request for a reply LiteLLM cannot map."""
    upstream.reset()
    entries = [{**_groq(upstream)[0]}]
    entries[0]["litellm_params"] = {**entries[0]["litellm_params"], "num_retries": 2}
    unmappable, flaky = "own: map me #count", "own: flaky #count #fail:500x2 #tier:default"
    results = await _run(entries, [unmappable, flaky], retries=0)
    counts = upstream.stats()["by_custom"]
    assert counts[unmappable] == 1 and counts[flaky] == 3, counts
    assert [r.status_code for r in results] == [500, 200]
