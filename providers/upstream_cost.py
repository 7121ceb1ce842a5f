"""What one upstream call cost: the config's prices when it gives them, else LiteLLM's price map's.

A deployment may carry `input_cost_per_token` / `output_cost_per_token` in its
`model_info` or `litellm_params` (LiteLLM's proxy reads both); then the reply's
token counts times those prices. Otherwise, on the pass-through
(`for_deployment`), the prices LiteLLM's local price map (`litellm.model_cost`,
never fetched) gives the deployment's model, looked up once per deployment
(`model_info.base_model` first, as LiteLLM does for Azure deployments); on
LiteLLM's completion path (`cost`), its own per-call price.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.records import Usage

_KEYS = ("input_cost_per_token", "output_cost_per_token")


def _price(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class Prices:
    """Configured per-token prices by deployment id (the Router's `model_info.id`)."""

    def __init__(self, deployments: Iterable[dict[str, Any]]) -> None:
        listed = list(deployments)
        self._by_id: dict[str, tuple[float, float]] = {}
        for deployment in listed:
            info = deployment.get("model_info") or {}
            params = deployment.get("litellm_params") or {}
            found = [_price(info.get(k, params.get(k))) for k in _KEYS]
            if any(p is not None for p in found) and info.get("id") is not None:
                self._by_id[str(info["id"])] = (found[0] or 0.0, found[1] or 0.0)
        self._deployments = {str((d.get("model_info") or {}).get("id")): d for d in listed}
        self._mapped: dict[str, tuple[float, float] | None] = {}

    def for_deployment(self, deployment_id: str, body: dict[str, Any]) -> float | None:
        """A pass-through reply's cost: its `usage` times the deployment's prices (config, else price map)."""
        prices = self._by_id.get(deployment_id)
        if prices is None:
            if deployment_id not in self._mapped:
                self._mapped[deployment_id] = _price_map(self._deployments.get(deployment_id) or {})
            prices = self._mapped[deployment_id]
        if prices is None:
            return None
        usage = Usage.from_body(body)
        return usage.input_tokens * prices[0] + usage.output_tokens * prices[1]

    def cost(self, reply: Any, body: dict[str, Any]) -> float | None:
        hidden = getattr(reply, "_hidden_params", None) or {}
        if not isinstance(hidden, dict):
            hidden = dict(hidden) if hasattr(hidden, "keys") else {}
        configured = self._by_id.get(str(hidden.get("model_id")))
        if configured is not None:
            usage = Usage.from_body(body)
            return usage.input_tokens * configured[0] + usage.output_tokens * configured[1]
        cost = hidden.get("response_cost")
        return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None


def _price_map(deployment: dict[str, Any]) -> tuple[float, float] | None:
    """The deployment's per-token prices in LiteLLM's local price map, or None when it has none."""
    import litellm

    model = str((deployment.get("litellm_params") or {}).get("model") or "")
    base = (deployment.get("model_info") or {}).get("base_model")
    provider, _, name = model.partition("/")
    for key in (base, model, name, f"{provider}/{base}" if base else None):
        entry = litellm.model_cost.get(key) if isinstance(key, str) and key else None
        if isinstance(entry, dict):
            found = [_price(entry.get(k)) for k in _KEYS]
            if any(p is not None for p in found):
                return found[0] or 0.0, found[1] or 0.0
    return None
