"""What a request costs, in one module: per-token prices from the operator's config, else LiteLLM's price map.

One name per idea: `Prices` is a pair of USD per-token prices (input, output) and what a usage costs at
them; `route_prices` the prices a route's `model_info` gives (local routes: the shard runner prices their
results); `DeploymentPrices` the prices of each upstream deployment, by the Router's deployment id (real-time
routes); `batch_prices` a native deployment's prices at batch rates.

Prices are the operator's (trusted), never a line's: a deployment may carry
`input_cost_per_token` / `output_cost_per_token` in its `model_info` or
`litellm_params` (LiteLLM's proxy reads both); then the reply's token counts
times those prices. Otherwise the per-token prices LiteLLM's local price map
(`price_map`: the file its wheel ships, read without importing LiteLLM) gives the deployment's model, looked up
once per deployment (`model_info.base_model` first, as LiteLLM does for Azure
deployments), read when the Router is built. Token counts are the reply's sane
ones only (`Usage.read`).

On LiteLLM's completion path (`DeploymentPrices.cost`) the same rule holds. LiteLLM's own per-call
`response_cost` is not taken where a per-token price is known: it is computed
from the call's keyword arguments (custom prices, `base_model`, `metadata.model_info`,
`optional_params`), which a line's body becomes. It is the price only of a
deployment that neither the config nor the price map prices by the token (an
image model, priced per image), and then only a finite, non-negative one.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NamedTuple

from gateway.config.priced_fields import PER_TOKEN_KEYS, TIER_NAME, Charge, extra_cost, tier_of
from gateway.config.wildcards import pattern_model  # the one rule that fills a pattern's `*`s
from gateway.domain import Usage
from gateway.lru import LRU

_PRICE_FILE = "model_prices_and_context_window_backup.json"  # the map LiteLLM ships in its wheel

_KEYS = PER_TOKEN_KEYS
CONCRETE_KEPT = 4096  # a wildcard's concrete models whose price-map entry is kept


class Prices(NamedTuple):
    """USD per input token, per output token; and, where the provider prices its prompt cache apart (Anthropic),
    per input token read from it and per input token written to it (None: those cost `input`)."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        plain = usage.input_tokens
        cost = usage.output_tokens * self.output
        if self.cache_read is not None:
            cost += usage.cached_tokens * self.cache_read
            plain -= usage.cached_tokens
        if self.cache_write is not None:
            cost += usage.cache_write_tokens * self.cache_write
            plain -= usage.cache_write_tokens
        return cost + max(plain, 0) * self.input


def cost_of(usage: Usage, prices: Prices | None) -> float | None:
    """What `usage` costs at `prices`; None when no price is known."""
    return prices.cost(usage) if prices is not None else None


def route_prices(model_info: Mapping[str, Any]) -> Prices | None:
    """A route's per-token prices from its `model_info`, if the config gives any."""
    inp, out = model_info.get("input_cost_per_token"), model_info.get("output_cost_per_token")
    if inp is None and out is None:
        return None
    return Prices(float(inp or 0), float(out or 0))


BATCH_PRICE_KEYS = ("input_cost_per_token_batches", "output_cost_per_token_batches")


def _cache_prices(info: Mapping[str, Any], suffix: str, scale: float) -> tuple[float | None, float | None]:
    """(read, write) prompt-cache prices of a price source (`suffix`: `_batches` or ""), times `scale`."""
    read = _price(info.get(f"cache_read_input_token_cost{suffix}"))
    write = _price(info.get(f"cache_creation_input_token_cost{suffix}"))
    return (None if read is None else read * scale), (None if write is None else write * scale)


def batch_prices(model_info: Mapping[str, Any], model_cost: Mapping[str, Any], candidates: Sequence[str],
                 discount: float | None = 0.5) -> Prices | None:
    """(input, output) USD per token at batch rates: model_info first, then LiteLLM's price map.

    `*_cost_per_token_batches` are used as they are; plain `*_cost_per_token` are times `discount` (0.5: the 50%
    batch discount of OpenAI, Azure, Anthropic and Mistral alike). A provider whose batch discount is not one rule
    (Groq, Together: `discount` None) has no rule to derive one: the config's plain prices are its batch prices as
    written, and the map's real-time prices are not read. The prompt cache's prices (`cache_read_input_token_
    cost`, `cache_creation_input_token_cost`) come from the same source the same way. None when no price is known.
    """
    sources = [model_info, *(model_cost.get(name) or {} for name in candidates if name)]
    for source, info in enumerate(sources):
        if "input_cost_per_token_batches" in info or "output_cost_per_token_batches" in info:
            read, write = _cache_prices(info, "_batches", 1.0)
            if read is None and write is None and discount is not None:
                read, write = _cache_prices(info, "", discount)
            return Prices(float(info.get("input_cost_per_token_batches") or 0),
                          float(info.get("output_cost_per_token_batches") or 0), read, write)
        if discount is None and source > 0:
            continue  # the map's real-time price is not this provider's batch price
        if "input_cost_per_token" in info or "output_cost_per_token" in info:
            scale = 1.0 if discount is None else discount
            return Prices(float(info.get("input_cost_per_token") or 0) * scale,
                          float(info.get("output_cost_per_token") or 0) * scale, *_cache_prices(info, "", scale))
    return None


def realtime_prices(model_info: Mapping[str, Any], model_cost: Mapping[str, Any], candidates: Sequence[str]) -> (
    Prices | None
):
    """(input, output, cache read, cache write) USD per token of a real-time call, from the same sources in the
    same order as `batch_prices` (a native route's priming request, `providers.native.cache_priming`)."""
    sources = [model_info, *(model_cost.get(name) or {} for name in candidates if name)]
    for info in sources:
        if "input_cost_per_token" in info or "output_cost_per_token" in info:
            return Prices(float(info.get("input_cost_per_token") or 0), float(info.get("output_cost_per_token") or 0),
                          *_cache_prices(info, "", 1.0))
    return None


def _price(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class DeploymentPrices:
    """Each upstream deployment's per-token prices, by deployment id (the Router's `model_info.id`).

    A wildcard deployment (`openai/*`) serves many concrete models: each is priced by its own price first (a
    deployment of the config sending that same model with prices, then LiteLLM's price map), else by the
    pattern's `model_info` prices; looked up once per model, kept in a bounded LRU (`CONCRETE_KEPT`)."""

    def __init__(self, deployments: Iterable[dict[str, Any]]) -> None:
        listed = list(deployments)
        self._by_id: dict[str, Prices] = {}
        # a concrete model's own price in the config: a named (not wildcard) deployment sending it, priced
        self._configured: dict[str, dict[str, Any]] = {}
        for deployment in listed:
            info = deployment.get("model_info") or {}
            params = deployment.get("litellm_params") or {}
            found = [_price(info.get(k, params.get(k))) for k in _KEYS]
            if any(p is not None for p in found) and info.get("id") is not None:
                self._by_id[str(info["id"])] = Prices(found[0] or 0.0, found[1] or 0.0)
            model = str(params.get("model") or "")
            if any(p is not None for p in found) and "*" not in model and model not in self._configured:
                self._configured[model] = {k: v for src in (params, info) for k, v in src.items() if "cost" in k}
        self._deployments = {str((d.get("model_info") or {}).get("id")): d for d in listed}
        # Read from the price map now, before any line runs: LiteLLM registers prices a call's keyword
        # arguments carry into that same global map (`litellm.model_cost`), so a later read could see them.
        self._mapped = {key: _price_map(d) for key, d in self._deployments.items() if key not in self._by_id}
        # Every price key a priced field may need (gateway.config.priced_fields), read now for the same reason.
        self._entries = {key: _map_entry(d) or {} for key, d in self._deployments.items()}
        self._groups: dict[str, list[str]] = {}
        for key, d in self._deployments.items():
            self._groups.setdefault(str(d.get("model_name")), []).append(key)
        self._concrete: LRU[str, dict[str, Any]] = LRU(CONCRETE_KEPT)  # a concrete model's map entry
        # Told when a reply reports a tier no price is known for: (the deployment's model_name, the tier)
        self.on_unpriced_tier: Callable[[str, str], None] | None = None

    def wildcard(self, deployment_id: str) -> bool:
        """Whether the deployment's model has `*`s a line's model fills."""
        params = (self._deployments.get(deployment_id) or {}).get("litellm_params") or {}
        return "*" in str(params.get("model") or "")

    def concrete(self, deployment_id: str, line_model: str) -> str | None:
        """The model a wildcard deployment sends for a line naming `line_model` (None: not a wildcard one)."""
        if not self.wildcard(deployment_id):
            return None
        deployment = self._deployments[deployment_id]
        return pattern_model(str(deployment.get("model_name")), str(deployment["litellm_params"]["model"]),
                             line_model)

    def _sources(self, deployment_id: str, model: str | None) -> tuple[Mapping[str, Any], ...]:
        """Where a price key of the deployment is read, in order: its config's (`model_info`, else
        `litellm_params`), else the price map's. For a wildcard deployment's concrete `model`: the model's
        own (the config's, then the map's) before the pattern's."""
        deployment = self._deployments.get(deployment_id) or {}
        info = deployment.get("model_info") or {}
        params = deployment.get("litellm_params") or {}
        if model is not None and self.wildcard(deployment_id):
            entry = self._concrete.get(model)
            if entry is None:
                entry = self._concrete.put(model, _map_entry({"litellm_params": {"model": model}}) or {})
            return self._configured.get(model) or {}, entry, info, params
        return info, params, self._entries.get(deployment_id) or {}

    def lookup(self, deployment_id: str, model: str | None = None) -> Callable[[str], Any]:
        """A price key of the deployment (of its concrete `model`, on a wildcard one): see `_sources`."""
        sources = self._sources(deployment_id, model)
        params = (self._deployments.get(deployment_id) or {}).get("litellm_params") or {}
        provider = str(params.get("model") or "").partition("/")[0]

        def find(key: str) -> Any:
            for source in sources:
                if source.get(key) is not None:
                    return source[key]
            if key == "code_interpreter_cost_per_session":  # the map prices containers per provider
                return (price_map().get(f"{provider}/container") or {}).get(key)
            return None

        return find

    def group(self, model_name: str) -> list[str]:
        """The deployment ids of one model group."""
        return self._groups.get(model_name, [])

    def tier_prices(self, deployment_id: str, tier: str, model: str | None = None) -> Prices | None:
        """The deployment's per-token prices at a tier (`input_cost_per_token_{tier}`, ...), None if unknown."""
        if not _is_tier(tier):
            return None  # `batches`, `above_128k_tokens`, ...: price keys, not tiers a reply runs at
        find = self.lookup(deployment_id, model)
        found = [_price(find(f"{k}_{tier}")) for k in _KEYS]
        return Prices(found[0] or 0.0, found[1] or 0.0) if any(p is not None for p in found) else None

    def highest_prices(self, deployment_id: str, model: str | None = None) -> Prices | None:
        """The highest per-token prices known for the deployment's model, any tier's (the base ones only where
        no other is known): what a reply at a tier with no known price is billed."""
        highest = [-1.0, -1.0]  # none known yet
        for source in self._sources(deployment_id, model):
            for key, value in source.items():
                for i, name in enumerate(_KEYS):
                    price = _price(value) if isinstance(key, str) and key.startswith(name) else None
                    if price is not None and math.isfinite(price) and price > highest[i]:
                        highest[i] = price
        if max(highest) < 0:
            return None
        return Prices(max(highest[0], 0.0), max(highest[1], 0.0))

    def prices(self, deployment_id: str, model: str | None = None) -> Prices | None:
        """The deployment's per-token prices: the config's, else the price map's (None: neither gives one). For
        a wildcard deployment's concrete `model`: the model's own (config, then map), else the pattern's."""
        if model is not None and self.wildcard(deployment_id):
            for source in self._sources(deployment_id, model):
                found = [_price(source.get(k)) for k in _KEYS]
                if any(p is not None for p in found):
                    return Prices(found[0] or 0.0, found[1] or 0.0)
            return None
        return self._by_id.get(deployment_id) or self._mapped.get(deployment_id)

    def for_deployment(self, deployment_id: str, body: dict[str, Any], charges: Sequence[Charge] = (),
                       model: str | None = None) -> float | None:
        """A reply's cost: its `usage` times the deployment's prices (`prices`), at the tier the reply reports
        (asked or not; a tier with no known price at the highest price known for the model, and
        `on_unpriced_tier` told), plus what the line's allowed priced fields add
        (`gateway.config.priced_fields`: searches, containers).

        `model`: the model the deployment was sent as; a wildcard deployment (`openai/*`) is priced per
        concrete model (`openai/gpt-4o`)."""
        prices = self.prices(deployment_id, model)
        tier = tier_of(charges, body)
        if tier is not None:
            tiered = self.tier_prices(deployment_id, tier, model)
            if tiered is None:
                tiered = self.highest_prices(deployment_id, model)
                if self.on_unpriced_tier is not None:
                    name = str((self._deployments.get(deployment_id) or {}).get("model_name"))
                    self.on_unpriced_tier(name, tier)
            prices = tiered or prices
        extra = extra_cost(charges, body, self.lookup(deployment_id, model)) if charges else 0.0
        if prices is None:
            return None
        return prices.cost(Usage.from_body(body)) + extra

    def cost(self, reply: Any, body: dict[str, Any], charges: Sequence[Charge] = (),
             line_model: str | None = None) -> float | None:
        """A completion-path reply's cost: as `for_deployment` for the deployment the Router chose (a wildcard
        one for the model it filled from `line_model`); LiteLLM's `response_cost` only for a deployment with
        no per-token price anywhere (see the module docs)."""
        # an object's attribute; a key of the dict the Anthropic-messages adapter returns
        hidden = reply.get("_hidden_params") if isinstance(reply, dict) else getattr(reply, "_hidden_params", None)
        hidden = hidden or {}
        if not isinstance(hidden, dict):
            hidden = dict(hidden) if hasattr(hidden, "keys") else {}
        deployment_id = str(hidden.get("model_id", ""))  # set by the Router from the config's deployment
        if deployment_id in self._deployments:
            model = self.concrete(deployment_id, line_model) if line_model is not None else None
            priced = self.for_deployment(deployment_id, body, charges, model)
            if priced is not None:
                return priced
        cost = _price(hidden.get("response_cost"))
        return cost if cost is not None and math.isfinite(cost) and cost >= 0 else None

    def priced_for(self, model_name: str, line_model: str) -> bool:
        """Whether every deployment of group `model_name` knows a per-token price for a line naming
        `line_model` (a wildcard's concrete model priced as `prices` says)."""
        return all(self.prices(key, self.concrete(key, line_model)) is not None for key in self.group(model_name))


def _is_tier(tier: str) -> bool:
    """A tier a reply may report (`priority`, `flex`, `scale`, ...); never a price key's other suffixes."""
    return (TIER_NAME.fullmatch(tier) is not None and tier != "batches"
            and not tier.startswith(("above_", "cache", "audio", "image")))


def deployment_prices(deployment: Mapping[str, Any]) -> Prices | None:
    """One upstream deployment's per-token prices as `DeploymentPrices` reads them: the config's (`model_info`,
    else `litellm_params`), else the price map's; None when neither gives one (the cost estimate's rule)."""
    info = deployment.get("model_info") or {}
    params = deployment.get("litellm_params") or {}
    found = [_price(info.get(k, params.get(k))) for k in _KEYS]
    if any(p is not None for p in found):
        return Prices(found[0] or 0.0, found[1] or 0.0)
    return _price_map(dict(deployment))


def _price_map(deployment: dict[str, Any]) -> Prices | None:
    """The deployment's per-token prices in LiteLLM's local price map, or None when it has none."""
    entry = _map_entry(deployment)
    if entry is None:
        return None
    found = [_price(entry.get(k)) for k in _KEYS]
    return Prices(found[0] or 0.0, found[1] or 0.0)


def _map_entry(deployment: dict[str, Any]) -> dict[str, Any] | None:
    """The deployment's entry in LiteLLM's local price map (the first with a per-token price), or None."""
    model = str((deployment.get("litellm_params") or {}).get("model") or "")
    base = (deployment.get("model_info") or {}).get("base_model")
    provider, _, name = model.partition("/")
    prices = price_map()
    for key in (base, model, name, f"{provider}/{base}" if base else None):
        entry = prices.get(key) if isinstance(key, str) and key else None
        if isinstance(entry, dict) and any(_price(entry.get(k)) is not None for k in _KEYS):
            return dict(entry)
    return None


@functools.cache
def price_map() -> Mapping[str, Any]:
    """LiteLLM's local price map as `litellm.model_cost` holds it at import (`LITELLM_LOCAL_MODEL_COST_MAP`),
    read from the file its wheel ships: importing LiteLLM takes seconds, and its live map also holds the
    prices calls register (a line's keyword arguments). An `alias_of` entry is its target's, as LiteLLM
    resolves it."""
    spec = find_spec("litellm")
    if spec is None or spec.origin is None:
        return {}
    raw: dict[str, Any] = json.loads((Path(spec.origin).parent / _PRICE_FILE).read_bytes())

    def resolved(entry: Any, hops: int = 0) -> Any:
        if isinstance(entry, dict) and set(entry) == {"alias_of"} and hops < 8:
            return resolved(raw.get(entry["alias_of"]), hops + 1)
        return entry

    return {key: resolved(entry) for key, entry in raw.items() if isinstance(entry, dict)}
