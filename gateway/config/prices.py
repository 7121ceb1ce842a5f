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

from gateway.config.priced_fields import Charge, extra_cost, tier_of
from gateway.domain import Usage

_PRICE_FILE = "model_prices_and_context_window_backup.json"  # the map LiteLLM ships in its wheel

_KEYS = ("input_cost_per_token", "output_cost_per_token")


class Prices(NamedTuple):
    """USD per input token, per output token."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        return usage.input_tokens * self.input + usage.output_tokens * self.output


def cost_of(usage: Usage, prices: Prices | None) -> float | None:
    """What `usage` costs at `prices`; None when no price is known."""
    return prices.cost(usage) if prices is not None else None


def route_prices(model_info: Mapping[str, Any]) -> Prices | None:
    """A route's per-token prices from its `model_info`, if the config gives any."""
    inp, out = model_info.get("input_cost_per_token"), model_info.get("output_cost_per_token")
    if inp is None and out is None:
        return None
    return Prices(float(inp or 0), float(out or 0))


def batch_prices(model_info: Mapping[str, Any], model_cost: Mapping[str, Any], candidates: Sequence[str]) -> (
    Prices | None
):
    """(input, output) USD per token at batch rates: model_info first, then LiteLLM's price map.

    `*_cost_per_token_batches` are used as they are; plain `*_cost_per_token` are halved (the 50% batch
    discount of OpenAI, Azure, Anthropic and Mistral alike). None when no price is known.
    """
    sources = [model_info, *(model_cost.get(name) or {} for name in candidates if name)]
    for info in sources:
        if "input_cost_per_token_batches" in info or "output_cost_per_token_batches" in info:
            return Prices(float(info.get("input_cost_per_token_batches") or 0),
                          float(info.get("output_cost_per_token_batches") or 0))
        if "input_cost_per_token" in info or "output_cost_per_token" in info:
            return Prices(float(info.get("input_cost_per_token") or 0) / 2,
                          float(info.get("output_cost_per_token") or 0) / 2)
    return None


def _price(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class DeploymentPrices:
    """Each upstream deployment's per-token prices, by deployment id (the Router's `model_info.id`)."""

    def __init__(self, deployments: Iterable[dict[str, Any]]) -> None:
        listed = list(deployments)
        self._by_id: dict[str, Prices] = {}
        for deployment in listed:
            info = deployment.get("model_info") or {}
            params = deployment.get("litellm_params") or {}
            found = [_price(info.get(k, params.get(k))) for k in _KEYS]
            if any(p is not None for p in found) and info.get("id") is not None:
                self._by_id[str(info["id"])] = Prices(found[0] or 0.0, found[1] or 0.0)
        self._deployments = {str((d.get("model_info") or {}).get("id")): d for d in listed}
        # Read from the price map now, before any line runs: LiteLLM registers prices a call's keyword
        # arguments carry into that same global map (`litellm.model_cost`), so a later read could see them.
        self._mapped = {key: _price_map(d) for key, d in self._deployments.items() if key not in self._by_id}
        # Every price key a priced field may need (gateway.config.priced_fields), read now for the same reason.
        self._entries = {key: _map_entry(d) or {} for key, d in self._deployments.items()}
        self._groups: dict[str, list[str]] = {}
        for key, d in self._deployments.items():
            self._groups.setdefault(str(d.get("model_name")), []).append(key)

    def lookup(self, deployment_id: str) -> Callable[[str], Any]:
        """A price key of the deployment: its config's (`model_info`, else `litellm_params`), else the map's."""
        deployment = self._deployments.get(deployment_id) or {}
        info = deployment.get("model_info") or {}
        params = deployment.get("litellm_params") or {}
        entry = self._entries.get(deployment_id) or {}
        provider = str(params.get("model") or "").partition("/")[0]

        def find(key: str) -> Any:
            for source in (info, params, entry):
                if source.get(key) is not None:
                    return source[key]
            if key == "code_interpreter_cost_per_session":  # the map prices containers per provider
                return (price_map().get(f"{provider}/container") or {}).get(key)
            return None

        return find

    def group(self, model_name: str) -> list[str]:
        """The deployment ids of one model group."""
        return self._groups.get(model_name, [])

    def tier_prices(self, deployment_id: str, tier: str) -> Prices | None:
        """The deployment's per-token prices at a tier (`input_cost_per_token_{tier}`, ...), None if unknown."""
        find = self.lookup(deployment_id)
        found = [_price(find(f"{k}_{tier}")) for k in _KEYS]
        return Prices(found[0] or 0.0, found[1] or 0.0) if any(p is not None for p in found) else None

    def prices(self, deployment_id: str) -> Prices | None:
        """The deployment's per-token prices: the config's, else the price map's (None: neither gives one)."""
        return self._by_id.get(deployment_id) or self._mapped.get(deployment_id)

    def for_deployment(self, deployment_id: str, body: dict[str, Any], charges: Sequence[Charge] = (),
                       model: str | None = None) -> float | None:
        """A pass-through reply's cost: its `usage` times the deployment's prices (config, else price map), and
        what the line's allowed priced fields add (`gateway.config.priced_fields`: a tier's prices instead,
        searches, containers).

        `model`: the model the deployment was sent as; a wildcard deployment (`openai/*`) is priced from the
        price map per concrete model (`openai/gpt-4o`), looked up once each."""
        prices = self.prices(deployment_id)
        if prices is None and model is not None and "*" in str(
                (self._deployments.get(deployment_id, {}).get("litellm_params") or {}).get("model", "")):
            key = f"{deployment_id}\0{model}"
            if key not in self._mapped:
                deployment = self._deployments[deployment_id]
                self._mapped[key] = _price_map({**deployment, "litellm_params": {"model": model}})
            prices = self._mapped[key]
        extra = 0.0
        if charges:
            tier = tier_of(charges, body)
            if tier is not None:
                prices = self.tier_prices(deployment_id, tier) or prices
            extra = extra_cost(charges, body, self.lookup(deployment_id))
        if prices is None:
            return None
        return prices.cost(Usage.from_body(body)) + extra

    def cost(self, reply: Any, body: dict[str, Any], charges: Sequence[Charge] = ()) -> float | None:
        """A completion-path reply's cost: as `for_deployment` for the deployment the Router chose; LiteLLM's
        `response_cost` only for a deployment with no per-token price anywhere (see the module docs)."""
        # an object's attribute; a key of the dict the Anthropic-messages adapter returns
        hidden = reply.get("_hidden_params") if isinstance(reply, dict) else getattr(reply, "_hidden_params", None)
        hidden = hidden or {}
        if not isinstance(hidden, dict):
            hidden = dict(hidden) if hasattr(hidden, "keys") else {}
        deployment_id = str(hidden.get("model_id", ""))  # set by the Router from the config's deployment
        if deployment_id in self._deployments:
            priced = self.for_deployment(deployment_id, body, charges)
            if priced is not None:
                return priced
        cost = _price(hidden.get("response_cost"))
        return cost if cost is not None and math.isfinite(cost) and cost >= 0 else None


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
