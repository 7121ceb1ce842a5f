"""OpenAI-wire routes at wire speed: the line's body goes out as bytes, the provider's reply comes back as sent.

For a model group whose every deployment speaks OpenAI's wire format
(`openai/`, `text-completion-openai/`, `azure/`, `hosted_vllm/`,
`custom_openai/`, each with any `api_base`) there is nothing to translate, so
LiteLLM's completion path (typed response, success handlers, per-call pricing
and logging: most of its per-call CPU) is skipped:

- LiteLLM's Router still chooses each attempt's deployment
  (`async_get_available_deployment`: load balancing, cooldowns, rpm/tpm
  routing), runs its rpm pre-call check, counts successes and failures and
  puts failing deployments in cooldown (`deployment_callback_on_failure`).
- The body goes out with `model` set to the deployment's, through one pooled
  aiohttp session per deployment (measured: a fraction of httpx's CPU per call).
- Retries follow the openai SDK's public rules (408/409/429/5xx,
  `x-should-retry`, `retry-after(-ms)`, exponential backoff with jitter;
  `providers.retry_policy`), the Router's `num_retries` times, each retry
  picked anew by the Router. Connection errors and timeouts are retried as
  the SDK retries them.
- The provider's status and body are the line's result as sent; only `usage`
  is read (counts and cost).
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import yarl

from gateway import tracing
from gateway.config.endpoints import ENDPOINTS
from gateway.config.model_names import name_problem, path_segment, slash_allowed
from gateway.config.wildcards import is_pattern, pattern_model
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.json_codec import dumps, loads
from gateway.lru import LRU
from providers.retry_policy import should_retry, wire_retried
from providers.upstream_errors import UPSTREAM_TIMEOUT, UPSTREAM_UNREACHABLE, provider_error, reply_error

# Idle pooled connections are dropped after this long: under uvicorn's (and so vLLM's) 5-s keep-alive, so we
# never send on a connection the upstream is closing. With aiohttp's 15 s, the first requests after a 5-15 s
# lull (a pool of 64 idle together) met the upstream's close and failed unreached (a POST is not resent on
# a dead keep-alive connection; with num_retries 0, measured: 64 of 20,000 lines of a batch that started
# 5 s after the one before it).
KEEPALIVE_SECONDS = 4.0
# LiteLLM providers whose wire format is OpenAI's own
PROVIDERS = frozenset({"openai", "text-completion-openai", "azure", "hosted_vllm", "custom_openai"})
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024  # batch_settings.max_passthrough_reply_bytes
TARGETS_KEPT = 4096  # (deployment, model) targets kept: a wildcard's models come from lines

# The litellm_params a pass-through deployment may carry: those the Router reads or this module applies.
# Anything else (Azure AD credentials, max_parallel_requests, custom headers, ...) keeps LiteLLM's
# completion path, which applies it: no setting is accepted and then ignored.
_PARAMS = frozenset({"model", "api_key", "api_base", "api_version", "timeout", "organization", "rpm", "tpm",
                     "weight", "order", "tags", "input_cost_per_token", "output_cost_per_token", "num_retries"})
_KEY_ENV = {"openai": "OPENAI_API_KEY", "text-completion-openai": "OPENAI_API_KEY", "azure": "AZURE_API_KEY",
            "hosted_vllm": "HOSTED_VLLM_API_KEY", "custom_openai": "OPENAI_API_KEY"}


def wire_provider(params: Mapping[str, Any]) -> str | None:
    """The deployment's provider if it can take the pass-through, else None."""
    model = params.get("model")
    if not isinstance(model, str) or "/" not in model or not set(params) <= _PARAMS:
        return None
    provider = model.split("/", 1)[0]
    if provider not in PROVIDERS or (provider != "openai" and not params.get("api_base")):
        return None
    return provider


def _env_proxy(url: str) -> str | None:
    """The proxy the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) names for `url`, as httpx would use it."""
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme or "https")


class _TooLong(Exception):
    """An upstream reply past `max_reply_bytes`: read no further."""


class _Failed(Exception):
    """One attempt's error reply, in the shape the Router's failure callback reads (status, headers)."""

    def __init__(self, status: int, headers: httpx.Headers) -> None:
        super().__init__(f"upstream answered {status}")
        self.status_code = status
        self.litellm_response_headers = headers


@dataclass(slots=True)
class _Sent:
    """One attempt's outcome: the line's result were it the last, the deployment tried, and whether to retry."""

    result: Result
    target: _Target | None
    again: bool = False
    headers: httpx.Headers | None = None

    @property
    def retries(self) -> int:
        return self.target.num_retries if self.target is not None else 0


@dataclass(slots=True)
class _Target:
    """Where one deployment's requests go, and how."""

    id: str
    provider: str
    model: str  # the wire model: the deployment's, without the provider prefix
    base: str
    headers: dict[str, str]
    api_version: str | None
    timeout: float
    num_retries: int
    has_limits: bool
    proxy: str | None = None
    host: str = field(init=False, default="")  # scheme://host:port of `base`: its pool (`PassThrough._session`)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.base)
        self.host = f"{parts.scheme}://{parts.netloc}"

    def url(self, endpoint: Endpoint) -> str:
        """The request's URL. The deployment name is one percent-encoded path segment (`path_segment`): with
        aiohttp told the URL is encoded (`_send`), nothing resolves `..` or cuts at `#` in it."""
        path = ENDPOINTS[endpoint].wire_path
        if self.provider != "azure":
            return self.base + path
        from openai.lib.azure import _deployments_endpoints  # the SDK's rule for Azure's deployment urls

        if self.api_version in ("v1", "latest", "preview") or self.base.endswith("/openai/v1"):
            root = self.base if self.base.endswith("/openai/v1") else self.base + "/openai/v1"
            return root + path + (f"?api-version={self.api_version}" if self.api_version == "preview" else "")
        if path in _deployments_endpoints:
            return f"{self.base}/openai/deployments/{path_segment(self.model)}{path}?api-version={self.api_version}"
        return f"{self.base}/openai{path}?api-version={self.api_version}"


class PassThrough:
    """Sends lines of OpenAI-wire model groups; the Router (started by the backend) chooses."""

    def __init__(self, router: Any, max_concurrency: int, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        import litellm

        self._router = router
        self._limit = max_concurrency
        self._max_reply = max_reply_bytes
        self._targets: LRU[tuple[str, str], _Target] = LRU(TARGETS_KEPT)  # by (deployment id, its model)
        self._sessions: dict[str, aiohttp.ClientSession] = {}  # by host (`_session`)
        self._ssl = getattr(litellm, "ssl_verify", True) is not False  # litellm_settings.ssl_verify
        self._family = socket.AF_INET if getattr(litellm, "force_ipv4", False) else socket.AF_UNSPEC
        self._timeout = float(getattr(router, "timeout", None) or litellm.request_timeout or 600)

    def target(self, deployment: dict[str, Any], pattern: str | None = None, model: str = "") -> _Target | str:
        """The target of a deployment the Router handed out. Asked by a wildcard's `pattern` (`call`), the
        deployment's model still has its `*`s: they are filled for the line's `model` here, once per model.
        A filled model that is not a name of the deployment's provider gives the reason instead (validation
        refused it already: `gateway.config.wildcards`; this holds for any caller)."""
        info = deployment.get("model_info") or {}
        key = str(info.get("id"))
        # A wildcard deployment answers for many models under one id, so a target is per both.
        wire_model = str(deployment["litellm_params"]["model"])
        if pattern is not None and "*" in wire_model:
            wire_model = model
        target = self._targets.get((key, wire_model))
        if target is None:
            sent = str(deployment["litellm_params"]["model"])
            if pattern is not None and "*" in sent:
                filled = pattern_model(pattern, sent, model)
                if filled is None:
                    return f"the wildcard route {pattern!r} does not match it"
                sent = filled
            made = self._new_target(key, deployment, sent)
            if isinstance(made, str):
                return made
            target = self._targets.put((key, wire_model), made)
        return target

    def _new_target(self, key: str, deployment: dict[str, Any], sent: str) -> _Target | str:
        import litellm

        params = deployment["litellm_params"]
        # The provider is the deployment's (the config's), never read from a model a line filled in
        provider = str(params["model"]).split("/", 1)[0]
        if not sent.startswith(provider + "/"):
            return f"it would leave the route's provider {provider!r}"
        model = sent[len(provider) + 1:]
        if "*" in str(params["model"]):
            why = name_problem(model, slash=slash_allowed(provider, params.get("api_base")))
            if why is not None:
                return f"not a model name of provider {provider}: {why}"
        api_key = params.get("api_key") or os.environ.get(_KEY_ENV[provider])
        base = str(params.get("api_base") or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
                   or "https://api.openai.com/v1")
        headers = {"Content-Type": "application/json"}
        if provider == "azure":
            if api_key:
                headers["api-key"] = str(api_key)
        elif api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if params.get("organization"):
            headers["OpenAI-Organization"] = str(params["organization"])
        info = deployment.get("model_info") or {}
        limits = (params.get("rpm"), params.get("tpm"), deployment.get("rpm"), deployment.get("tpm"),
                  info.get("rpm"), info.get("tpm"))
        retries = params.get("num_retries")
        return _Target(
            id=key, provider=provider, model=model, base=base.rstrip("/"), headers=headers,
            # as LiteLLM: the deployment's, else AZURE_API_VERSION, else its default
            api_version=params.get("api_version") or os.environ.get("AZURE_API_VERSION")
            or getattr(litellm, "AZURE_DEFAULT_API_VERSION", None),
            timeout=float(params.get("timeout") or self._timeout),
            num_retries=int(retries if retries is not None else (self._router.num_retries or 0)),
            has_limits=any(v is not None for v in limits),
            proxy=_env_proxy(base),
        )

    def _session(self, target: _Target) -> aiohttp.ClientSession:
        # One per host (scheme, host, port), shared by every deployment and every wildcard model sent there: one
        # pool of connections each host's lines reuse whichever route they came by. A session per model opened
        # a pool per model (1,280 more connections in a 5,000-line half-wildcard run), and one per deployment
        # still a pool per route: a pool left idle while another route's shards ran lost its connections to
        # the server's keep-alive timeout and opened them again (672 connects against 192, profiled).
        key = target.host
        session = self._sessions.get(key)
        if session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl, family=self._family,
                                             keepalive_timeout=KEEPALIVE_SECONDS)
            # trust_env would look the proxy (and netrc) up in a thread on every request: _env_proxy does it once
            session = self._sessions[key] = aiohttp.ClientSession(connector=connector, trust_env=False)
        return session

    async def aclose(self) -> None:
        sessions = list(self._sessions.values())
        self._targets.clear()
        self._sessions.clear()
        for session in sessions:
            await session.close()

    async def call(self, req: BatchRequest, group: str, declared: str | None = None) -> tuple[Result, _Target | None]:
        """One line of model `group`: the Router picks, we send; retried by `providers.retry_policy`.

        `declared`: the model_name of model_list that serves `group` (`gateway.config.wildcards`). Where it is a
        wildcard pattern, the Router is asked by the pattern: asked by the concrete name, it would match its
        patterns and deep-copy the deployment on every call (`PatternMatchRouter.route`), a tenth of a
        millisecond a line (measured); the concrete model is filled once per model instead (`target`)."""
        last: list[_Target | None] = [None]  # the deployment of the latest attempt
        pattern = declared if declared is not None and is_pattern(declared) else None

        async def attempt() -> _Sent:
            sent = await self._attempt(req, group, last[0], pattern)
            last[0] = sent.target
            return sent

        sent = await wire_retried(attempt, float(getattr(self._router, "retry_after", 0) or 0))  # retry_after: a floor
        return sent.result, sent.target

    async def _attempt(self, req: BatchRequest, group: str, target: _Target | None, pattern: str | None) -> _Sent:
        """One try: the Router picks a deployment (anew each time), the body goes out, the reply is the result."""
        router = self._router
        try:
            deployment = await router.async_get_available_deployment(model=pattern or group, request_kwargs={})
            await router.async_routing_strategy_pre_call_checks(deployment=deployment, parent_otel_span=None)
        except Exception as exc:  # no deployment available (all cooling down, over their rpm)
            err = provider_error(exc, req.model)
            return _Sent(Result(line=req.line, custom_id=req.custom_id, status_code=err.status, body=err.body,
                                model=req.model), target)
        found = self.target(deployment, pattern, group)
        if isinstance(found, str):
            return _Sent(Result.http_error(req.line, req.custom_id, 404, f"The provided model '{req.model}' does not "
                                           f"exist or is not supported by the Batch API ({found}).",
                                           type_="invalid_request_error", code="model_not_found", model=req.model),
                         None)
        target = found
        body = dict(req.body)
        body["model"] = target.model
        try:
            status, headers, data = await self._send(target, req.url, dumps(body))
        except _TooLong:
            return _Sent(Result.failure(req.line, req.custom_id, "upstream_reply_too_large",
                                        f"the upstream for model {req.model!r} answered with more than "
                                        f"{self._max_reply} bytes (batch_settings.max_passthrough_reply_bytes)",
                                        model=req.model), target)
        except (TimeoutError, aiohttp.ClientError) as exc:
            code = UPSTREAM_TIMEOUT if isinstance(exc, TimeoutError) else UPSTREAM_UNREACHABLE
            self._failed(deployment, group, 408 if code == UPSTREAM_TIMEOUT else 503, httpx.Headers())
            what = "did not answer in time" if code == UPSTREAM_TIMEOUT else "could not be reached"
            return _Sent(Result.failure(req.line, req.custom_id, code, f"the upstream for model {req.model!r} {what}",
                                        model=req.model), target, again=True)  # retried as the SDK retries them
        if 200 <= status < 300:
            return _Sent(await self._succeeded(req, deployment, group, target, status, data), target)
        self._failed(deployment, group, status, headers)
        return _Sent(Result(line=req.line, custom_id=req.custom_id, status_code=status,
                            body=reply_error(status, data), model=req.model), target,
                     again=should_retry(status, headers), headers=headers)

    async def _send(self, target: _Target, endpoint: Endpoint, data: bytes) -> tuple[int, httpx.Headers, bytes]:
        session = self._session(target)
        timeout = aiohttp.ClientTimeout(total=target.timeout)
        headers = tracing.outgoing(target.headers)  # the request span's traceparent, with tracing on
        # encoded=True: the URL is sent as built (names percent-encoded there), never re-normalised by yarl
        async with session.post(yarl.URL(target.url(endpoint), encoded=True), data=data, headers=headers,
                                timeout=timeout,
                                proxy=target.proxy) as reply:
            raw = await self._read(reply)
            if 200 <= reply.status < 300:
                return reply.status, httpx.Headers(), raw
            return reply.status, httpx.Headers(list(reply.headers.items())), raw

    async def _read(self, reply: aiohttp.ClientResponse) -> bytes:
        """The reply's body, up to `max_reply_bytes` (its declared length checked first, then what streams)."""
        if (reply.content_length or 0) > self._max_reply:
            raise _TooLong()
        raw = bytearray()
        async for chunk in reply.content.iter_chunked(1 << 16):
            raw += chunk
            if len(raw) > self._max_reply:
                raise _TooLong()
        return bytes(raw)

    async def _succeeded(self, req: BatchRequest, deployment: dict[str, Any], group: str, target: _Target,
                         status: int, data: bytes) -> Result:
        from litellm.router_utils.router_callbacks.track_deployment_metrics import (
            increment_deployment_successes_for_current_minute,
        )

        try:
            body = loads(data)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return Result.failure(req.line, req.custom_id, "upstream_error",
                                  f"the upstream for model {req.model!r} answered {status} without a JSON object",
                                  model=req.model)
        increment_deployment_successes_for_current_minute(self._router, target.id)  # the Router's cooldown math
        if target.has_limits:  # the Router's tpm/rpm counters, only where a limit reads them
            metadata = {"model_info": deployment.get("model_info") or {}, "deployment": deployment["litellm_params"]
                        ["model"]}
            await self._router.increment_deployment_usage_for_response(
                response=body, request_kwargs={"model": group, "litellm_metadata": metadata})
        return Result(line=req.line, custom_id=req.custom_id, status_code=status, body=body, model=req.model)

    def _failed(self, deployment: dict[str, Any], group: str, status: int, headers: httpx.Headers) -> None:
        """The Router's own failure bookkeeping: failures per minute, cooldown by its rules."""
        kwargs = {"exception": _Failed(status, headers),
                  "litellm_params": {"model_info": deployment.get("model_info") or {},
                                     "metadata": {"model_group": group}}}
        self._router.deployment_callback_on_failure(kwargs, None, None, None)
