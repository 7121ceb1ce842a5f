"""What one upstream call cost: the config's prices when it gives them, else LiteLLM's.

A deployment may carry `input_cost_per_token` / `output_cost_per_token` in its
`model_info` or `litellm_params` (LiteLLM's proxy reads both); then the reply's
token counts times those prices. Otherwise LiteLLM's own per-call price
(`_hidden_params["response_cost"]`, from its local price map: never fetched).
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
        self._by_id: dict[str, tuple[float, float]] = {}
        for deployment in deployments:
            info = deployment.get("model_info") or {}
            params = deployment.get("litellm_params") or {}
            found = [_price(info.get(k, params.get(k))) for k in _KEYS]
            if any(p is not None for p in found) and info.get("id") is not None:
                self._by_id[str(info["id"])] = (found[0] or 0.0, found[1] or 0.0)

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
