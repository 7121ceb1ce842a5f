"""The pass-through: OpenAI-wire routes send the line's bytes and keep the provider's reply; LiteLLM's Router chooses.

The upstream backend in-process against the real loopback upstream (which requires a key here, so a
passing call proves the auth header); the `openai` SDK reads the same upstream for the reference reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint, Result
from providers.litellm_backend import LiteLLMBackend
from tests.fakes.upstream.server import Upstream, start_upstream

KEY = "sk-passthrough"
PRICE_IN, PRICE_OUT = 0.001, 0.002


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(api_key=KEY) as up:
        yield up


def entry(group: str, model: str, base: str, **params: Any) -> dict[str, Any]:
    info = params.pop("model_info", None)
    e: dict[str, Any] = {"model_name": group, "litellm_params": {"model": model, "api_key": KEY, "api_base": base,
                                                                 **params}}
    if info:
        e["model_info"] = info
    return e


@pytest.fixture
async def backend(upstream: Upstream) -> AsyncIterator[LiteLLMBackend]:
    v1, root = upstream.v1_url, upstream.url
    entries = [
        entry("gpt-4o-mini", "openai/gpt-4o-mini", v1),
        entry("lb", "openai/lb-a", v1), entry("lb", "openai/lb-b", v1),
        entry("azure-chat", "azure/my-deployment", root, api_version="2024-10-21"),
        entry("vllm", "hosted_vllm/llama", v1),
        entry("priced", "openai/house-model", v1,
              model_info={"input_cost_per_token": PRICE_IN, "output_cost_per_token": PRICE_OUT}),
        entry("mistral", "mistral/mistral-small", v1),  # LiteLLM translates for Mistral: its completion path
    ]
    routes = list(parse_config({"model_list": entries}).routes.values())
    b = LiteLLMBackend(routes, {"num_retries": 2, "retry_after": 0}, 16)
    yield b
    await b.aclose()


def chat(i: int, model: str, text: str) -> BatchRequest:
    return BatchRequest(line=i, custom_id=f"c{i}", url=Endpoint.CHAT,
                        body={"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0})


async def run(backend: LiteLLMBackend, requests: list[BatchRequest]) -> dict[str, Result]:
    return {r.custom_id: r async for r in backend.execute(requests)}


async def test_the_reply_is_the_providers_own(backend: LiteLLMBackend, upstream: Upstream) -> None:
    [ours] = (await run(backend, [chat(1, "gpt-4o-mini", "keep everything #extra")])).values()
    sdk = openai.AsyncOpenAI(base_url=upstream.v1_url, api_key=KEY, max_retries=0)
    raw = await sdk.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "keep everything #extra"}], temperature=0)
    theirs = raw.http_response.json()
    await sdk.close()
    assert ours.status_code == 200 and ours.body is not None
    strip = {"id", "created"}  # the only fields that differ between two calls
    assert {k: v for k, v in ours.body.items() if k not in strip} == {k: v for k, v in theirs.items() if k not in strip}
    assert ours.body["x_provider"] == {"region": "loopback", "cached": False}  # fields OpenAI's types don't know
    assert "prompt_logprobs" in ours.body and ours.body["model"] == "gpt-4o-mini"
    assert ours.usage.input_tokens == theirs["usage"]["prompt_tokens"]


async def test_translation_providers_keep_the_completion_path(backend: LiteLLMBackend, upstream: Upstream) -> None:
    out = await run(backend, [chat(1, "mistral", "translated #extra"), chat(2, "vllm", "as sent #extra")])
    assert out["c1"].status_code == 200 and out["c2"].status_code == 200
    assert out["c1"].body is not None and out["c2"].body is not None
    assert out["c1"].body["choices"][0]["message"]["content"] == "echo: translated #extra"
    # LiteLLM's typed response adds its own fields; the pass-through keeps the provider's message as sent
    assert "provider_specific_fields" in out["c1"].body["choices"][0]["message"]
    assert out["c2"].body["choices"][0]["message"] == {"role": "assistant", "content": "echo: as sent #extra",
                                                       "refusal": None}
    assert out["c2"].body["x_provider"] == {"region": "loopback", "cached": False}  # hosted_vllm: passed through


async def test_the_router_balances_the_deployments_of_a_group(backend: LiteLLMBackend, upstream: Upstream) -> None:
    before = upstream.stats()["by_model"]
    out = await run(backend, [chat(i, "lb", f"spread {i}") for i in range(1, 41)])
    assert all(r.status_code == 200 and r.body is not None for r in out.values())
    assert all("provider_specific_fields" not in r.body["choices"][0]["message"] for r in out.values() if r.body)
    after = upstream.stats()["by_model"]
    calls = {m: after.get(m, 0) - before.get(m, 0) for m in ("lb-a", "lb-b")}
    assert calls["lb-a"] + calls["lb-b"] == 40 and calls["lb-a"] > 0 and calls["lb-b"] > 0  # the wire model set


async def test_retries_follow_the_sdks_rules(backend: LiteLLMBackend, upstream: Upstream) -> None:
    texts = {"c1": "pt flaky #fail:429x2 #count", "c2": "pt down #fail:500 #count", "c3": "pt bad #fail:400 #count",
             "c4": "pt conflict #fail:409x1 #count"}
    out = await run(backend, [chat(int(c[1:]), "gpt-4o-mini", t) for c, t in texts.items()])
    counted = upstream.stats()["by_custom"]
    assert out["c1"].status_code == 200 and counted[texts["c1"]] == 3  # two 429s retried, then the answer
    assert out["c2"].status_code == 500 and counted[texts["c2"]] == 3  # num_retries 2, then the provider's 500
    assert out["c2"].body == {"error": {"message": "Injected failure 500 (#fail directive).", "type": "server_error",
                                        "param": None, "code": None}}  # as the provider sent it
    assert out["c3"].status_code == 400 and counted[texts["c3"]] == 1  # the SDK never retries a 400
    assert out["c4"].status_code == 200 and counted[texts["c4"]] == 2  # ... and retries a 409


async def test_azure_url_version_and_key_come_from_the_deployment(backend: LiteLLMBackend, upstream: Upstream) -> None:
    before = upstream.stats()["by_path"]
    out = await run(backend, [chat(1, "azure-chat", "to azure"),
                              BatchRequest(line=2, custom_id="c2", url=Endpoint.EMBEDDINGS,
                                           body={"model": "azure-chat", "input": "vector"})])
    assert out["c1"].status_code == 200 and out["c1"].body is not None
    assert out["c1"].body["model"] == "my-deployment"  # the loopback answers with the deployment it was called at
    assert out["c2"].status_code == 200 and out["c2"].body is not None
    assert out["c2"].body["data"][0]["object"] == "embedding"
    after = upstream.stats()["by_path"]
    for path in ("/openai/deployments/my-deployment/chat/completions", "/openai/deployments/my-deployment/embeddings"):
        assert after.get(path, 0) - before.get(path, 0) == 1  # with api-key: the upstream requires the key


async def test_cost_from_the_config_else_from_the_price_map(backend: LiteLLMBackend) -> None:
    import litellm

    out = await run(backend, [chat(1, "priced", "one two three"), chat(2, "gpt-4o-mini", "four five")])
    priced, mapped = out["c1"], out["c2"]
    configured = priced.usage.input_tokens * PRICE_IN + priced.usage.output_tokens * PRICE_OUT
    assert priced.cost_usd == pytest.approx(configured) and configured > 0
    entry = litellm.model_cost["gpt-4o-mini"]
    expected = (mapped.usage.input_tokens * entry["input_cost_per_token"]
                + mapped.usage.output_tokens * entry["output_cost_per_token"])
    assert mapped.cost_usd == pytest.approx(expected) and expected > 0


async def test_an_unreachable_deployments_lines_are_answered_by_its_sibling(upstream: Upstream) -> None:
    good = entry("pair", "openai/good", upstream.v1_url)
    dead = entry("pair", "openai/dead", "http://127.0.0.1:9/v1")
    backend = LiteLLMBackend(list(parse_config({"model_list": [good, dead]}).routes.values()),
                             {"num_retries": 3, "retry_after": 0, "allowed_fails": 0, "cooldown_time": 60}, 4)
    try:
        out = await run(backend, [chat(i, "pair", f"pair {i}") for i in range(1, 21)])
        assert all(r.status_code == 200 for r in out.values()), [r.error for r in out.values() if r.error]
    finally:
        await backend.aclose()


def test_config_entries_choose_the_path(tmp_path: Path) -> None:
    from gateway.config.schema import load_config
    from providers.litellm_backend import wire_groups

    (tmp_path / "c.yaml").write_text("""model_list:
  - {model_name: plain, litellm_params: {model: openai/gpt-4o-mini, api_key: k}}
  - {model_name: az, litellm_params: {model: azure/d, api_key: k, api_base: "http://127.0.0.1:9", api_version: v1}}
  - {model_name: mixed, litellm_params: {model: openai/gpt-4o-mini, api_key: k}}
  - {model_name: mixed, litellm_params: {model: anthropic/claude-3-5-haiku-latest, api_key: k}}
  - {model_name: bounded, litellm_params: {model: openai/gpt-4o-mini, api_key: k, max_parallel_requests: 2}}
""")
    config = load_config(tmp_path / "c.yaml")
    deployments = [d for route in config.routes.values() for d in route.model_list()]
    assert wire_groups(deployments, {}) == {"plain", "az"}  # every deployment OpenAI-wire, nothing it would drop
    assert wire_groups(deployments, {"success_callback": ["langfuse"]}) == set()  # callbacks: LiteLLM's path


def test_reference_reply_is_what_httpx_reads(upstream: Upstream) -> None:
    # the loopback itself requires the key: without it, 401 (so the tests above prove the headers)
    reply = httpx.post(upstream.v1_url + "/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert reply.status_code == 401


async def test_the_routers_fallbacks_answer_when_a_group_fails(upstream: Upstream) -> None:
    dead = entry("primary", "openai/gpt-4o-mini", "http://127.0.0.1:9/v1")
    spare = entry("spare", "openai/spare-model", upstream.v1_url)
    routes = list(parse_config({"model_list": [dead, spare]}).routes.values())
    backend = LiteLLMBackend(routes, {"num_retries": 0, "fallbacks": [{"primary": ["spare"]}]}, 4)
    try:
        out = await run(backend, [chat(1, "primary", "fall back")])
    finally:
        await backend.aclose()
    assert out["c1"].status_code == 200 and out["c1"].body is not None
    assert out["c1"].body["model"] == "spare-model" and out["c1"].model == "primary"  # counted on the caller's route
