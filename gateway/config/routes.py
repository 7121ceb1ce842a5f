"""`Route`: where a model name goes.

Resolved from the config's `model_list`: every entry with one `model_name`
forms one route. A route is local (an in-process vLLM engine: `vllm/...`),
upstream in real time (one call per line through LiteLLM's Router), or
upstream-native (shards forwarded as provider batch jobs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from gateway.config.endpoints import NATIVE_PROVIDERS  # one row each in NATIVE_JOBS, with its jobs class


def native_refusal(model: str) -> str | None:
    """Why a deployment of `model` (`provider/name`) cannot be `batch_mode: native`; None when it can.

    Checked at load: a native route on another provider would otherwise have every line fail, or be
    quietly run in real time at twice the price."""
    provider = model.partition("/")[0]
    if provider in NATIVE_PROVIDERS:
        return None
    return (f"native batches run on {', '.join(NATIVE_PROVIDERS)} deployments, not {provider}/ "
            "(use batch_mode: realtime)")


class RouteKind(str, enum.Enum):
    LOCAL = "local"
    UPSTREAM = "upstream"
    NATIVE = "native"


@dataclass(slots=True)
class Route:
    model_name: str
    kind: RouteKind
    # The config entries (model_name, litellm_params, engine_args, model_info)
    # with os.environ/ already resolved. Several entries: load-balanced deployments.
    deployments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def engine_args(self) -> dict[str, Any]:
        """A local route's engine arguments, with the model path taken from `vllm/<path>`."""
        entry = self.deployments[0]
        model = entry["litellm_params"]["model"].removeprefix("vllm/")
        # The engine answers to the name lines use (vLLM checks body.model against it). vLLM fetches media
        # only from the hosts the gateway allows (an empty list is vLLM's "any host": the gateway refuses
        # every fetched URL itself then, see gateway.pipeline.media_urls).
        args = {"model": model, "served_model_name": [self.model_name], **(entry.get("engine_args") or {})}
        if self.allowed_media_domains:
            args["allowed_media_domains"] = sorted(self.allowed_media_domains)
        return args

    @property
    def model_info(self) -> dict[str, Any]:
        return dict(self.deployments[0].get("model_info") or {})

    def _allowed(self, key: str) -> frozenset[str]:
        # What every deployment allows: the Router may send a line to any of them.
        lists = [frozenset((d.get("model_info") or {}).get(key) or ()) for d in self.deployments]
        return frozenset.intersection(*lists) if lists else frozenset()

    @property
    def allowed_params(self) -> frozenset[str]:
        """Body fields a line may carry beyond the endpoint's documented ones (`model_info.allowed_params`)."""
        return self._allowed("allowed_params")

    @property
    def allowed_media_domains(self) -> frozenset[str]:
        """Hosts whose media URLs the gateway may fetch for a line (`model_info.allowed_media_domains`)."""
        return self._allowed("allowed_media_domains")
