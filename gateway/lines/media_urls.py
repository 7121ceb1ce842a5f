"""Media URLs in a line: the gateway fetches none unless the operator lists the host.

vLLM (local routes) fetches the http(s) media a chat line names (`image_url`, `audio_url`, `video_url`, a
transcription's `file_url`), and LiteLLM does the same when it translates a line for a provider that wants
the bytes inline (Anthropic, Bedrock, Vertex, ...). Either way the fetch comes from the gateway's own
network: a team could read an internal service or a cloud metadata address through it. So a fetched URL
is allowed only for a host the model's `model_info.allowed_media_domains` lists (vLLM's
`allowed_media_domains` is set from the same list, so the engine checks it too), and never when the host
is or resolves to a private, loopback, link-local or otherwise non-public address. `data:` URLs carry
their bytes inline and are always fine; `file:` is vLLM's own rule (`allowed_local_media_path`).

Where the line goes decides who fetches. The OpenAI-wire pass-through (and a Messages line bridged onto it)
sends the body as bytes: on a public provider's own host (no `api_base`, or the host the provider documents:
LiteLLM's default `api_base` for it) the provider fetches from its own network, not ours, so those lines are
not walked. A route whose `api_base` is anything else (the operator's vLLM, a `hosted_vllm/` or
`custom_openai/` server, an `openai/` entry pointed at a private address or at any host not a provider's)
is internal: the server it reaches fetches from inside, so its lines get the same rule as the gateway's own
fetches. A route's class is decided once, when the backend starts (`internal_deployment`, then
`resolves_private` for the public-looking hosts: one DNS lookup per host, never one per line).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from gateway.domain import BatchRequest, Result

# Keys whose string value is a URL that a server fetches (OpenAI's and vLLM's content parts, both shapes:
# `{"image_url": {"url": ...}}` and the Responses API's `{"image_url": "..."}`; Anthropic's `source.url`).
_URL_KEYS = frozenset({"url", "image_url", "audio_url", "video_url", "file_url"})
# Keys that hold an id or inline bytes, but that LiteLLM (1.110.2) fetches when the value is a URL: a chat
# `file` part's `file.file_id` and `file.file_data`, a `file` given as a plain string, the part's own
# `file_data`, and the Responses API's `input_file.file_data` and `file_id` (its Gemini, Vertex, Anthropic
# and Bedrock translations: litellm_core_utils/prompt_templates/factory.py). Held to the same rule when
# their value is written as a URL (`scheme://…`); an id (`file-abc`) or a `data:` URL is no fetch.
_ID_KEYS = frozenset({"file", "file_id", "file_data"})
_URL_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_INLINE_SCHEMES = frozenset({"data", "file"})
_MAX_DEPTH = 64  # message content is shallow; a deeper body is walked no further (validation bounds it anyway)
_START_LOOKUP_SECONDS = 3.0  # a route's api_base host, looked up once when its backend starts
_RESOLVED_FOR = 60.0  # seconds a host's addresses are trusted before they are looked up again

_resolved: dict[str, tuple[float, bool]] = {}  # host -> (when, every address public)


def fetched_urls(body: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    """(param, url) for every URL in `body` that a server would fetch (any scheme but data: and file:)."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(body, dict):
        for key, value in body.items():
            where = f"{path}.{key}" if path else str(key)
            if key in _URL_KEYS and isinstance(value, str):
                scheme = value.partition(":")[0].lower() if ":" in value else ""
                if scheme and scheme not in _INLINE_SCHEMES:
                    yield where, value
            elif key in _ID_KEYS and isinstance(value, str):
                if _URL_FORM.match(value.lstrip()) and value.lstrip().partition(":")[0].lower() not in _INLINE_SCHEMES:
                    yield where, value.lstrip()
            else:
                yield from fetched_urls(value, where, depth + 1)
    elif isinstance(body, list):
        for index, item in enumerate(body):
            yield from fetched_urls(item, f"{path}[{index}]", depth + 1)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _host_is_public(host: str) -> bool:
    try:
        return _public(host)  # an address written as such
    except ValueError:
        pass
    now = time.monotonic()
    cached = _resolved.get(host)
    if cached is not None and now - cached[0] < _RESOLVED_FOR:
        return cached[1]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        public = bool(infos) and all(_public(str(info[4][0])) for info in infos)
    except OSError:
        public = False  # a host that does not resolve would only fail later, inside the fetch
    _resolved[host] = (now, public)
    return public


async def media_refusal(body: dict[str, Any], allowed_hosts: Collection[str]) -> tuple[str, str] | None:
    """(param, why) for the first URL in `body` the gateway may not fetch; None when there is none."""
    for param, url in fetched_urls(body):
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError:
            return param, "the URL does not parse"
        if parts.scheme.lower() not in ("http", "https"):
            return param, f"{parts.scheme}: URLs are not fetched"
        if host not in allowed_hosts:
            return param, (f"fetching media from {host!r} is not allowed for this model (the operator lists its "
                           "hosts in model_info.allowed_media_domains; data: URLs need no fetch)")
        if not await _host_is_public(host):
            return param, f"{host!r} is a private, loopback or link-local address"
    return None


async def refused_media(req: BatchRequest, body: dict[str, Any], allowed_hosts: Collection[str]) -> Result | None:
    """The line's 400 for a media URL the gateway may not fetch; None when the body names none."""
    found = await media_refusal(body, allowed_hosts)
    if found is None:
        return None
    param, why = found
    return Result.http_error(req.line, req.custom_id, 400, f"Invalid media URL at '{param}': {why}",
                             type_="invalid_request_error", code="media_url_not_allowed", model=req.model,
                             param=param)


# The hosts a provider documents for its API where LiteLLM leaves the default `api_base` to its SDK (None from
# `get_llm_provider`); for the rest LiteLLM's own default is the provider's host. Azure's hosts are the
# operator's resources under Microsoft's domains.
_PROVIDER_HOSTS = {"openai": "api.openai.com", "text-completion-openai": "api.openai.com",
                   "anthropic": "api.anthropic.com", "gemini": "generativelanguage.googleapis.com"}
_PROVIDER_SUFFIXES = {"azure": (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com"),
                      "azure_text": (".openai.azure.com", ".cognitiveservices.azure.com")}
# Providers that are by nature an operator's own server: no host of theirs is public.
_SELF_HOSTED = frozenset({"hosted_vllm", "custom_openai", "vllm", "ollama", "ollama_chat", "lm_studio",
                          "llamafile", "openai_like", "litellm_proxy", "xinference", "triton"})


def _provider_host(provider: str) -> str | None:
    """The host of the provider's documented public API, or None when it has none (a self-hosted kind)."""
    if provider in _PROVIDER_HOSTS:
        return _PROVIDER_HOSTS[provider]
    from litellm import get_llm_provider  # lazy: LiteLLM is imported by the backend that asks

    try:
        default = get_llm_provider(f"{provider}/model")[3]
    except Exception:  # an unknown provider has no public host here
        return None
    return (urlsplit(default).hostname or "").lower() or None if isinstance(default, str) else None


def api_host(params: Mapping[str, Any]) -> str | None:
    """The host a deployment's calls go to when the config (or LiteLLM's environment) sets one; None: the
    provider's SDK default."""
    provider = str(params.get("model") or "").partition("/")[0]
    base = params.get("api_base") or params.get("base_url")
    if not base:  # LiteLLM and the providers' SDKs read these when the entry names none
        names = [f"{provider.upper()}_API_BASE", f"{provider.upper()}_BASE_URL"]
        base = next((os.environ[n] for n in names if os.environ.get(n)), None)
    if not isinstance(base, str) or not base:
        return None
    try:
        return (urlsplit(base).hostname or "").lower()
    except ValueError:
        return ""


def internal_deployment(params: Mapping[str, Any]) -> bool:
    """Whether a deployment's server is the operator's own (not a public provider's documented host), by name.

    A public-looking host may still resolve to a private address: `resolves_private` checks that, once."""
    provider = str(params.get("model") or "").partition("/")[0]
    host = api_host(params)
    if provider in _SELF_HOSTED:
        return True
    if host is None:
        return False  # the provider's own default host
    try:
        if not _public(host):
            return True  # an address written as such: private, loopback or link-local
    except ValueError:
        pass
    if host.endswith(_PROVIDER_SUFFIXES.get(provider, ())):
        return False
    return host != _provider_host(provider)


async def resolves_private(host: str) -> bool:
    """Whether `host` resolves to a non-public address now (looked up once, when a backend starts). A name
    that does not resolve (or not within a few seconds: a start must not hang on DNS) counts as public: no
    call to it can be made either."""
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM), _START_LOOKUP_SECONDS)
    except (OSError, TimeoutError):
        return False
    return any(not _public(str(info[4][0])) for info in infos)


__all__ = ["api_host", "fetched_urls", "internal_deployment", "media_refusal", "refused_media", "resolves_private"]
