"""Upstream providers in real time, through one LiteLLM `Router`.

The Router is built from every upstream entry of `model_list`: it chooses the
deployment (load balancing over several deployments of one `model_name`,
cooldowns, rpm/tpm limits) and decides retries and fallbacks. A model group
whose every deployment speaks OpenAI's wire format takes the pass-through
(`providers.passthrough`: the line's bytes out, the provider's reply back).
Every other group (providers that need translation: Anthropic, Vertex,
Bedrock, ...) keeps LiteLLM's completion path: this module maps the line to the
Router call for its endpoint and the reply (or the provider's error,
`providers.upstream_errors`) back to a `Result`, priced (`gateway.config.prices`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway import metrics, tracing
from gateway.backends.bounded import RequestSpans, run_bounded
from gateway.config.endpoints import ENDPOINTS, UPSTREAM_ENDPOINTS, WIRE_ENDPOINTS
from gateway.config.priced_fields import Charge, missing_price, priced_fields
from gateway.config.prices import DeploymentPrices
from gateway.config.routes import Route
from gateway.config.wildcards import is_pattern
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.lines.body_fields import LITELLM_OWN_FIELDS, unknown_field, unrecognized, unsupported, upstream_fields
from gateway.lines.budget import budgeted_now
from gateway.lines.media_urls import refused_media
from gateway.lru import LRU
from gateway.message_batches.wire import anthropic_error
from gateway.scheduling.busy_server import ConcurrencyShares, LocalShares
from gateway.scheduling.fairness import FairSlots
from gateway.tracing import genai
from providers import litellm_setup
from providers.background import BackgroundRoute, priority_refused
from providers.messages_bridge import message_through_wire
from providers.passthrough import DEFAULT_MAX_REPLY_BYTES, PassThrough, wire_provider
from providers.retry_policy import router_retried
from providers.router_groups import fallback_closure, internal_groups, wire_fallbacks
from providers.upstream_errors import UPSTREAM_ERROR, provider_error

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map at import

log = logging.getLogger("batchyard.providers")

# Router settings that are ours to default; the config's router_settings win, and
# litellm_settings.num_retries / request_timeout take the place of ours when given.
_ROUTER_DEFAULTS: dict[str, Any] = {"num_retries": 3, "timeout": 600, "retry_after": 0}
_LITELLM_FOR_ROUTER = {"num_retries": "num_retries", "timeout": "request_timeout"}

def router_kwargs(router: dict[str, Any], litellm_settings: dict[str, Any]) -> dict[str, Any]:
    """The Router's keyword arguments: the config's, then ours where neither section sets the value."""
    settings = dict(router)
    for key, default in _ROUTER_DEFAULTS.items():
        if key not in settings and _LITELLM_FOR_ROUTER.get(key, "") not in litellm_settings:
            settings[key] = default
    return settings


class LiteLLMBackend:
    """One backend for every upstream route: they share the Router and its limits."""

    endpoints = UPSTREAM_ENDPOINTS  # those with a Router method in gateway.config.endpoints

    def __init__(
        self,
        routes: Sequence[Route],
        router_settings: dict[str, Any],
        max_concurrency: int,
        litellm_settings: dict[str, Any] | None = None,
        resolve: Callable[[str], Route | None] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        shares: ConcurrencyShares | None = None,
        worker: str = "",
    ) -> None:
        self._model_list = [deployment for route in routes for deployment in route.model_list()]
        # A line's model -> its route (`Config.route`: an alias's target, a wildcard's concrete model); the
        # Router is asked the line's model and resolves it the same way, the checks below use the model_name
        # the config declares (`Route.declared`: the pattern of a wildcard route).
        self._resolve = resolve or {route.model_name: route for route in routes}.get
        self._groups: LRU[str, str] = LRU(4096)  # a line's model -> its group: lines name what they like
        self._providers: dict[str, str] = {}  # group -> gen_ai.provider.name (gateway.tracing)
        self._litellm_settings = dict(litellm_settings or {})
        self._settings = router_kwargs(router_settings, self._litellm_settings)
        self._limit = FairSlots(max_concurrency)  # shared by every shard, divided between teams
        self._router: Any = None
        self._prices = DeploymentPrices(())
        self._max_concurrency = max_concurrency
        self._max_reply_bytes = max_reply_bytes  # the pass-through's cap on an upstream reply
        self._wire: PassThrough | None = None
        self._wire_groups: frozenset[str] = frozenset()
        # What a line may carry beyond OpenAI's documented fields, and which media hosts may be fetched for it
        self._allowed_params = {route.model_name: route.allowed_params for route in routes}
        self._media_hosts = {route.model_name: route.allowed_media_domains for route in routes}
        # Wildcard routes whose unpriced models a team with a budget may still run (`model_info.allow_unpriced`)
        self._unpriced_ok = frozenset(route.model_name for route in routes if route.entries and all(
            e.model_info.allow_unpriced for e in route.entries))
        self._known: dict[tuple[Endpoint, str], frozenset[str]] = {}  # (endpoint, group) -> the fields it takes
        self._internal: frozenset[str] = frozenset()  # groups that reach an operator's own server (set at start)
        # batch_mode: background routes (providers.background): their own slots, paced by their server's load
        shared = shares if shares is not None else LocalShares()
        self._background = {
            route.model_name: BackgroundRoute(route.model_name, route.background,
                                              route.background.max_concurrency or max_concurrency, shared, worker)
            for route in routes if route.background is not None}

    async def start(self) -> None:
        if self._router is not None:
            return
        # Building a Router does seconds of synchronous work on first use: keep it off the event loop.
        self._router = await asyncio.to_thread(litellm_setup.build_router, self._model_list, self._settings,
                                               self._litellm_settings)
        self._prices = DeploymentPrices(self._router.model_list)  # by the deployment ids the Router gave
        self._prices.on_unpriced_tier = _unpriced_tier
        self._wire = PassThrough(self._router, self._max_concurrency, self._max_reply_bytes)
        # the config's entries, not the Router's copies (it adds its own defaults to litellm_params)
        self._wire_groups = wire_groups(self._model_list, self._litellm_settings)
        # every fallback list, as the Router reads them (router_settings', else litellm_settings' from the
        # module): a line may be sent on along any of them
        fallbacks = [entry for key in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks")
                     for entry in self._settings.get(key) or self._litellm_settings.get(key) or []]
        self._internal = await internal_groups(self._model_list, fallbacks)
        for group in self._internal:  # a line may be sent to any fallback: it may fetch only what all allow
            for fallback in fallback_closure(fallbacks, group):
                self._media_hosts[group] = self._media_hosts.get(group, frozenset()) & self._media_hosts.get(
                    fallback, frozenset())

    async def aclose(self) -> None:
        for paced in self._background.values():
            await paced.aclose()
        if self._router is None:
            return
        self._router = None
        if self._wire is not None:
            await self._wire.aclose()
            self._wire = None
        await litellm_setup.close_clients()

    async def execute(self, requests: Sequence[BatchRequest]) -> AsyncIterator[Result]:
        await self.start()
        # aclosing: closing this iterator must close the inner one now, not at garbage collection
        spans = RequestSpans(self._provider)
        # a shard is one route's: a background route's requests take its own paced slots
        paced = self._background.get(self._group(requests[0].model)) if requests else None
        if paced is not None:
            paced.start()
        slots = paced.slots if paced is not None else self._limit
        async with contextlib.aclosing(run_bounded(requests, self._call, slots, spans=spans)) as results:
            async for result in results:
                yield result

    def pacing(self) -> dict[str, dict[str, Any]]:
        """route -> its pacing here, for each background route that has run (`BackgroundRoute.state`)."""
        return {name: paced.state() for name, paced in self._background.items() if paced.metrics_up is not None}

    def _group(self, model: str) -> str:
        """The model_name of model_list that serves a line's model (cached per model)."""
        group = self._groups.get(model)
        if group is None:
            route = self._resolve(model)
            group = self._groups.put(model, route.declared if route is not None else model)
        return group

    def _provider(self, model: str) -> str:
        """gen_ai.provider.name of a line's model: its group's first deployment's LiteLLM provider."""
        group = self._group(model)
        name = self._providers.get(group)
        if name is None:
            found = next((str(d["litellm_params"].get("model", "")) for d in self._model_list
                          if d.get("model_name") == group), "")
            name = self._providers[group] = genai.provider_name(found.split("/", 1)[0] if "/" in found else "openai")
        return name

    async def _call(self, req: BatchRequest) -> Result:
        body = dict(req.body)
        model = body.pop("model")
        group = self._group(model)
        on_wire = self._wire is not None and group in self._wire_groups
        wire = on_wire and req.url in WIRE_ENDPOINTS
        if self._method(req.url) is None and not wire:
            return _no_method(req, model)
        # a Messages line on an OpenAI-wire route: translated, then sent as bytes (providers.messages_bridge)
        bridged = on_wire and req.url is Endpoint.MESSAGES
        refused = await self._refusal(req, group, body, wire, bridged)
        if refused is not None:
            return refused
        # the Router method's required arguments (one set on every upstream endpoint): a line without one gets
        # OpenAI's missing-parameter error instead of a TypeError from LiteLLM
        missing = next((name for name in ENDPOINTS[req.url].required[0] if name not in body), None)
        if missing is not None:
            error = {"message": f"Missing required parameter: '{missing}'.", "type": "invalid_request_error",
                     "param": missing, "code": "missing_required_parameter"}
            return Result(line=req.line, custom_id=req.custom_id, status_code=400, body={"error": error}, model=model)
        paced = self._background.get(group)
        if paced is not None:
            return await self._background_call(req, paced)
        if wire:
            return await self._pass_through(req, model)
        if bridged:
            return await message_through_wire(req, model, body, self._pass_through)
        return await self._completion(req, model, body)

    async def _completion(self, req: BatchRequest, model: str, body: dict[str, Any]) -> Result:
        """A checked line through LiteLLM's completion path (the Router's method for its endpoint)."""
        call = self._method(req.url)
        if call is None:  # image edits off the wire (a background route whose server is not OpenAI-wire)
            return _no_method(req, model)
        try:
            headers = tracing.headers()  # the request span's traceparent: ours, a line cannot set extra_headers
            if headers and "extra_headers" not in body:
                body["extra_headers"] = headers
            reply = await router_retried(lambda retries: call(model=model, num_retries=retries, **body), self._router,
                                         self._group(model))
        except Exception as exc:  # a provider error is this line's result, never the batch's end
            err = provider_error(exc, model)
            if err.body is None:
                return Result.failure(req.line, req.custom_id, str(err.code), str(err.message), model=model)
            assert err.status is not None  # a provider error with a body has its status
            # an Anthropic Messages line gets the error in Anthropic's shape, whatever provider answered
            body = anthropic_error(err.status, err.body) if req.url is Endpoint.MESSAGES else err.body
            return Result(line=req.line, custom_id=req.custom_id, status_code=err.status, body=body, model=model)
        if reply is None:
            # LiteLLM returns None when a provider keeps answering 422 after it dropped the
            # parameters it could (drop_params): the provider's reply is lost inside LiteLLM.
            return Result.failure(req.line, req.custom_id, UPSTREAM_ERROR,
                                  f"the upstream for model {model!r} rejected the request (no reply kept)", model=model)
        data = _to_body(reply, exclude_none=req.url in _SPARSE)
        cost = self._prices.cost(reply, data, priced_fields(req.url, body), line_model=model)
        return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=data, model=model, cost_usd=cost)

    async def _background_call(self, req: BatchRequest, paced: BackgroundRoute) -> Result:
        """A background route's line: sent with the route's `priority` (once the server refuses the field, without
        it: that line is sent again at once, without it)."""
        for _ in range(2):
            with_priority = paced.priority
            line = BatchRequest(line=req.line, custom_id=req.custom_id, url=req.url, body=paced.body(req.body))
            result = await self._sent(line, req.model)
            why = priority_refused(result) if with_priority else None
            if why is None:
                return result
            paced.refused(why)
        return result

    async def _sent(self, req: BatchRequest, model: str) -> Result:
        """A checked line through the pass-through, or LiteLLM's completion path (`priority` in `extra_body`)."""
        on_wire = self._wire is not None and self._group(model) in self._wire_groups
        if on_wire and req.url in WIRE_ENDPOINTS:
            return await self._pass_through(req, model)
        body = dict(req.body)
        body.pop("model")
        if on_wire and req.url is Endpoint.MESSAGES:  # translated by the bridge, which sends OpenAI's fields only
            body.pop("priority", None)
            return await message_through_wire(req, model, body, self._pass_through)
        priority = body.pop("priority", None)
        if priority is not None:
            body["extra_body"] = {**(body.get("extra_body") or {}), "priority": priority}
        return await self._completion(req, model, body)

    async def _refusal(self, req: BatchRequest, group: str, body: dict[str, Any], wire: bool,
                       bridged: bool = False) -> Result | None:
        """The line's 400 when its body holds more than data: a field outside the endpoint's documented ones
        and the operator's extras for the model, LiteLLM's own `metadata`, or a media URL we may not fetch.

        `body` is splatted into a LiteLLM call below, so this check is what keeps a line from setting a key,
        a base URL, a mock, a fallback or a price (see gateway.lines.body_fields). A wildcard route's model
        with no known price is refused under a team's budget (`price_unknown`): no line that reaches an
        upstream goes unbilled."""
        if is_pattern(group) and group not in self._unpriced_ok and budgeted_now() \
                and not self._prices.priced_for(group, req.model):
            return Result.http_error(req.line, req.custom_id, 400, f"No price is known for model '{req.model}' "
                                     f"(none in the config, none in LiteLLM's price map, none in the model_info "
                                     f"of {group!r}), and the team has a budget; the operator allows it with "
                                     f"model_info.allow_unpriced: true", type_="invalid_request_error",
                                     code="price_unknown", param="model", model=req.model)
        charges = priced_fields(req.url, body)
        if charges:
            refused = self._unpriced(req, group, charges)
            if refused is not None:
                return refused
        known = self._known.get((req.url, group))
        if known is None:
            known = upstream_fields(req.url) | self._allowed_params.get(group, frozenset())
            self._known[(req.url, group)] = known
        if group in self._background and "priority" in body:
            return unsupported(req, "priority", "batchyard sets it on this route: model_info.background_priority")
        name = unknown_field(body, known)
        if name is not None:
            return unrecognized(req, name)
        own = None if wire else next((f for f in LITELLM_OWN_FIELDS if f in body), None)
        if own == "metadata" and req.url is Endpoint.MESSAGES and _anthropic_metadata(body["metadata"]):
            own = None  # Anthropic's own `metadata`; on this path the Router keeps its own in `litellm_metadata`
        if own is not None:
            return unsupported(req, own, "LiteLLM reads it for itself on this provider's path")
        if (wire or bridged) and group not in self._internal:
            # The bytes go to a public provider's own host as they are (or translated, bridged): the provider
            # fetches media itself, from its own network. An internal server (gateway.lines.media_urls)
            # fetches from inside ours, so its lines hold the gateway's own rule, as LiteLLM's translation does.
            return None
        return await refused_media(req, body, self._media_hosts.get(group, frozenset()))

    def _unpriced(self, req: BatchRequest, model: str, charges: list[Charge]) -> Result | None:
        """The line's 400 for a field that changes the provider's price (gateway.config.priced_fields): one the
        operator does not allow for the model, or one no price is known for on a deployment of it."""
        allowed = self._allowed_params.get(model, frozenset())
        for charge in charges:
            if charge.name not in allowed:
                return unsupported(req, charge.param, f"it changes what the provider charges; the operator allows it "
                                   f"by listing {charge.name!r} in the model's model_info.allowed_params")
        for deployment_id in self._prices.group(model):
            why = missing_price(charges, self._prices.lookup(deployment_id))
            if why is not None:
                return unsupported(req, charges[0].param, why)
        return None

    async def _pass_through(self, req: BatchRequest, group: str, tried: frozenset[str] = frozenset()) -> Result:
        assert self._wire is not None
        result, target = await self._wire.call(req, group, self._group(group))
        if result.ok and target is not None and result.body is not None:
            result.cost_usd = self._prices.for_deployment(target.id, result.body, priced_fields(req.url, req.body),
                                                          f"{target.provider}/{target.model}")
            return result
        chain = wire_fallbacks(self._router, result, (self._routed(group), group))
        if chain:
            # The Router's fallbacks, as it would apply them after its retries: the next group in the list.
            for fallback in chain:
                if fallback in tried or fallback == group:
                    continue
                line = BatchRequest(line=req.line, custom_id=req.custom_id, url=req.url,
                                    body={**req.body, "model": fallback})
                fallback_group = self._group(fallback)
                if fallback_group in self._wire_groups:
                    # the fallback's own rules (its extras, price fields, media): the group's were checked
                    fields = {k: v for k, v in line.body.items() if k != "model"}
                    if await self._refusal(line, fallback_group, fields, wire=True) is not None:
                        continue
                    answer = await self._pass_through(line, fallback, tried | {group})
                else:
                    answer = await self._call(line)
                answer.model = req.model
                if answer.ok:
                    return answer
        return result

    def _routed(self, model: str) -> str:
        """The model_name a line's model is routed to (an alias's target; a wildcard's concrete model)."""
        route = self._resolve(model)
        return route.model_name if route is not None else model

    def _method(self, endpoint: Endpoint) -> Callable[..., Awaitable[Any]] | None:
        name = ENDPOINTS[endpoint].router_method
        return getattr(self._router, name) if name is not None else None


def _no_method(req: BatchRequest, model: str) -> Result:
    """The 400 of a line whose endpoint LiteLLM has no call for on this route (image edits: the wire's only)."""
    where = (" (in its JSON form it runs on OpenAI-wire routes only: an openai/, azure/, hosted_vllm/ or "
             "custom_openai/ deployment without LiteLLM-only settings)") if req.url in WIRE_ENDPOINTS else ""
    return Result.http_error(req.line, req.custom_id, 400, f"{req.url.value} is not supported for upstream models"
                             f"{where}", type_="invalid_request_error", code="unsupported_endpoint", model=model)


def _unpriced_tier(group: str, tier: str) -> None:
    """A reply reported a tier no price is known for: billed at the highest known price, counted, warned."""
    metrics.observe_unpriced_tier(group)
    log.warning("a reply of model group %r reported service tier %r, which has no known price: billed at the "
                "highest per-token price known for the model (set input_cost_per_token_%s)", group, tier[:64],
                tier[:64])


def _anthropic_metadata(value: Any) -> bool:
    """Anthropic's `metadata` as its API documents it: `user_id` and nothing else (nothing LiteLLM reads)."""
    return isinstance(value, dict) and set(value) <= {"user_id"} and isinstance(value.get("user_id"), str | None)


# LiteLLM's types for these replies add every field they know as null (moderation
# categories, image options); the provider sent none of them.
_SPARSE = frozenset({Endpoint.MODERATIONS, Endpoint.IMAGES})


def _to_body(reply: Any, exclude_none: bool = False) -> dict[str, Any]:
    data: dict[str, Any]
    if isinstance(reply, dict):  # the Anthropic-messages adapter's reply: a dict with LiteLLM's keys in it
        data = dict(reply)
    else:
        dump = getattr(reply, "model_dump", None)
        data = dump(exclude_none=exclude_none) if dump is not None else dict(reply)
    # LiteLLM's bookkeeping fields are not part of the provider's reply
    for key in ("_hidden_params", "_response_headers"):
        data.pop(key, None)
    return data


def wire_groups(deployments: Sequence[dict[str, Any]], litellm_settings: dict[str, Any]) -> frozenset[str]:
    """The model groups that take the pass-through: every deployment OpenAI-wire, and no LiteLLM callbacks
    configured (they run on LiteLLM's completion path only, so such a config keeps it for every group)."""
    if any(litellm_settings.get(k) for k in ("callbacks", "success_callback", "failure_callback")):
        return frozenset()
    groups: dict[str, bool] = {}
    for deployment in deployments:
        name = str(deployment.get("model_name"))
        params = dict(deployment.get("litellm_params") or {})
        if (deployment.get("model_info") or {}).get("batch_mode") == "background":
            params.pop("max_parallel_requests", None)  # the pacing's ceiling (providers.background) applies it
        groups[name] = groups.get(name, True) and wire_provider(params) is not None
    return frozenset(name for name, ok in groups.items() if ok)
