"""Media URLs on every upstream route kind: a route pointed at an operator's own server is internal.

An `openai/` deployment whose `api_base` is the loopback stub takes the OpenAI-wire pass-through (the line's
bytes go to that server as they are), as do `hosted_vllm/` and `custom_openai/`, and a Messages line on such a
route is bridged onto it. Their server fetches what a line names from inside the operator's network, so a line
naming a private address, or any host the model's `model_info.allowed_media_domains` does not list, is that
line's `media_url_not_allowed` before anything is sent: the stub never sees it. A listed (public) host passes.
Run with `batchyard run --config` on the loopback upstream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.lines.media_urls import internal_deployment, resolves_private
from tests.fakes.upstream.server import Upstream
from tests.servers.test_upstream_routes import req, run

PUBLIC_HOST = "93.184.215.14"  # a public address written as such: listed, it passes without a DNS lookup


def _image(url: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]


def _chat(cid: str, model: str, url: str) -> str:
    return req(cid, "/v1/chat/completions", model=model, max_tokens=4,
               messages=[{"role": "user", "content": _image(url)}])


def _message(cid: str, model: str, url: str) -> str:
    block = {"type": "image", "source": {"type": "url", "url": url}}
    return req(cid, "/v1/messages", model=model, max_tokens=4,
               messages=[{"role": "user", "content": [{"type": "text", "text": "what is this"}, block]}])


def test_media_urls_are_refused_on_internal_wire_hosted_custom_and_bridged_routes(
    upstream: Upstream, tmp_path: Path,
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"""
model_list:
  - model_name: wire
    litellm_params: {{model: openai/media-wire, api_key: sk-op, api_base: "{upstream.v1_url}"}}
  - model_name: hosted
    litellm_params: {{model: hosted_vllm/media-hosted, api_base: "{upstream.v1_url}"}}
  - model_name: custom
    litellm_params: {{model: custom_openai/media-custom, api_key: sk-op, api_base: "{upstream.v1_url}"}}
  - model_name: listed
    litellm_params: {{model: openai/media-listed, api_key: sk-op, api_base: "{upstream.v1_url}"}}
    model_info: {{allowed_media_domains: ["{PUBLIC_HOST}", localhost]}}
router_settings: {{num_retries: 0, retry_after: 0}}
""")
    metadata = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
    lines = [
        _chat("wire-metadata", "wire", metadata),
        _chat("wire-unlisted", "wire", f"http://{PUBLIC_HOST}/cat.png"),
        _chat("hosted-loopback", "hosted", "http://127.0.0.1:9/secret.png"),
        _chat("custom-unlisted", "custom", "https://images.example.com/cat.png"),
        _message("bridged-metadata", "wire", metadata),
        _chat("listed-loopback", "listed", "http://localhost:9/secret.png"),  # listed, but loopback
        _chat("listed-public", "listed", f"http://{PUBLIC_HOST}/cat.png"),
        _message("bridged-listed-public", "listed", f"https://{PUBLIC_HOST}/cat.png"),
        _chat("wire-inline", "wire", "data:image/png;base64,iVBORw0KGgo="),  # bytes inline: nothing fetched
    ]
    _, got = run(tmp_path, cfg, lines)

    def error(cid: str) -> dict[str, Any]:
        response = got[cid]["response"]
        assert response is not None and response["status_code"] == 400, got[cid]
        return dict(response["body"]["error"])

    chat_param = "messages[0].content[1].image_url.url"
    for cid in ("wire-metadata", "wire-unlisted", "hosted-loopback", "custom-unlisted", "listed-loopback"):
        assert error(cid)["code"] == "media_url_not_allowed", got[cid]
        assert error(cid)["param"] == chat_param
    # the bridged line keeps our code and the Messages request's own path
    bridged = got["bridged-metadata"]["response"]["body"]["error"]
    assert json.dumps(bridged).count("media_url_not_allowed") == 1, bridged
    assert "messages[0].content[1].source.url" in json.dumps(bridged)
    assert "not allowed for this model" in error("wire-unlisted")["message"]
    assert "loopback" in error("listed-loopback")["message"]
    for cid in ("listed-public", "bridged-listed-public", "wire-inline"):
        assert got[cid]["response"]["status_code"] == 200, got[cid]
    seen = upstream.stats()["by_model"]
    # nothing refused reached the operator's server: only the three lines that passed did
    assert seen.get("media-hosted", 0) == 0 and seen.get("media-custom", 0) == 0
    assert seen.get("media-wire", 0) == 1  # the data: line
    assert seen.get("media-listed", 0) == 2


@pytest.mark.parametrize(("params", "internal"), [
    ({"model": "openai/gpt-4o"}, False),  # the provider's own default host
    ({"model": "openai/gpt-4o", "api_base": "https://api.openai.com/v1"}, False),
    ({"model": "anthropic/claude-haiku-4-5"}, False),
    ({"model": "groq/llama-3", "api_base": "https://api.groq.com/openai/v1"}, False),  # LiteLLM's default base
    ({"model": "azure/gpt", "api_base": "https://team.openai.azure.com"}, False),
    ({"model": "openai/gpt-4o", "api_base": "http://127.0.0.1:8000/v1"}, True),
    ({"model": "openai/gpt-4o", "api_base": "http://10.0.0.7/v1"}, True),
    ({"model": "openai/gpt-4o", "api_base": "https://llm.corp.example/v1"}, True),  # a host nobody listed
    ({"model": "groq/llama-3", "api_base": "https://api.openai.com/v1"}, True),  # another provider's host
    ({"model": "hosted_vllm/m", "api_base": "https://api.openai.com/v1"}, True),  # self-hosted by nature
    ({"model": "custom_openai/m", "api_base": "http://vllm.internal/v1"}, True),
])
def test_a_route_is_internal_unless_its_host_is_the_providers_own(params: dict[str, Any], internal: bool) -> None:
    assert internal_deployment(params) is internal


async def test_a_group_is_internal_when_it_falls_back_to_an_internal_one_or_its_host_resolves_inside() -> None:
    from providers.router_groups import internal_groups

    def entry(name: str, **params: str) -> dict[str, Any]:
        return {"model_name": name, "litellm_params": {"model": "openai/gpt-4o", **params}}

    deployments = [entry("public"), entry("falls-back"), entry("inside", api_base="http://10.1.2.3/v1"),
                   entry("alone")]
    assert await internal_groups(deployments, [{"falls-back": ["inside"]}]) == {"falls-back", "inside"}
    assert await resolves_private("localhost") and not await resolves_private("no-such-host.invalid")
