"""`Route`: where a model name goes.

Resolved from the config's `model_list`: every entry with one `model_name`
forms one route (a wildcard `model_name` one route per concrete model a line names:
`gateway.config.wildcards`). A route is local (an in-process vLLM engine: `vllm/...`),
upstream in real time (one call per line through LiteLLM's Router), or
upstream-native (shards forwarded as provider batch jobs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from gateway.config.kinds import RouteKind, native_refusal

if TYPE_CHECKING:
    from gateway.config.entries import Entry, LocalEntry, ModelInfo


@dataclass(frozen=True, slots=True)
class BackgroundServer:
    """A `batch_mode: background` route's server: where its load is read and how its lines go out."""

    metrics_url: str  # its Prometheus endpoint
    served_model: str  # the `model_name` label its /metrics carry for this model (the model sent on the wire)
    priority: int  # the request field `priority` of every line
    max_concurrency: int | None  # `max_parallel_requests`: the pacing's ceiling (None: the backend's bound)


def metrics_url(api_base: str) -> str:
    """vLLM's `/metrics` beside its OpenAI API: `api_base` without `/v1`, plus `/metrics`."""
    base = api_base.rstrip("/")
    return base.removesuffix("/v1") + "/metrics"


@dataclass(slots=True)
class Route:
    model_name: str
    kind: RouteKind
    # The typed config entries of this model_name (os.environ/ already resolved), all of this route's
    # kind: a local route has one, an upstream route one per load-balanced deployment.
    entries: list[Entry] = field(default_factory=list)
    # The model_name as written in model_list when this route is one concrete model of a wildcard route
    # (`gateway.config.wildcards.derived`): the pattern, e.g. `openai/*`; None for a route written by name.
    group: str | None = None
    # A native route's providers' batch discounts, one per entry (`UpstreamJobs.batch_discount`), read from their
    # declarations when the config is read: a process that only gets the config (a validation child) has none.
    batch_discounts: tuple[float | None, ...] = ()

    def batch_discount(self, index: int) -> float | None:
        """The share of a real-time price entry `index`'s batches cost (None: only a batch price counts)."""
        return self.batch_discounts[index] if index < len(self.batch_discounts) else 0.5

    @property
    def declared(self) -> str:
        """The `model_name` of model_list this route comes from (the pattern of a wildcard route)."""
        return self.group if self.group is not None else self.model_name

    def model_list(self) -> list[dict[str, Any]]:
        """The entries as LiteLLM's Router takes them (its `model_list`), as written in the config."""
        return [entry.deployment() for entry in self.entries]

    @property
    def engine_args(self) -> dict[str, Any]:
        """A local route's engine arguments, with the model path taken from `vllm/<path>`."""
        if self.kind is not RouteKind.LOCAL:
            raise ValueError(f"{self.model_name} is a {self.kind.value} route: no engine runs it")
        entry = cast("LocalEntry", self.entries[0])  # a local route's entries are LocalEntry (schema._routes)
        model = entry.litellm_params.model.removeprefix("vllm/")
        # The engine answers to the name lines use (vLLM checks body.model against it). vLLM fetches media
        # only from the hosts the gateway allows (an empty list is vLLM's "any host": the gateway refuses
        # every fetched URL itself then, see gateway.lines.media_urls).
        args = {"model": model, "served_model_name": [self.model_name], **entry.engine_args}
        if self.allowed_media_domains:
            args["allowed_media_domains"] = sorted(self.allowed_media_domains)
        return args

    @property
    def model_info(self) -> ModelInfo:
        """The first entry's `model_info` (a native route's: `NativeModelInfo`)."""
        return self.entries[0].model_info

    @property
    def background(self) -> BackgroundServer | None:
        """The server of a `batch_mode: background` route (one deployment: `schema._routes`); None otherwise."""
        entry = self.entries[0] if self.entries and self.kind is RouteKind.UPSTREAM else None
        if entry is None or entry.model_info.batch_mode != "background":
            return None
        params = entry.litellm_params
        info = entry.model_info
        api_base = str((params.model_extra or {}).get("api_base") or "")
        limit = getattr(entry, "max_parallel_requests", None) or (params.model_extra or {}).get("max_parallel_requests")
        return BackgroundServer(metrics_url=info.metrics_url or metrics_url(api_base),
                                served_model=params.model.partition("/")[2], priority=info.background_priority,
                                max_concurrency=int(limit) if limit else None)

    @property
    def allowed_params(self) -> frozenset[str]:
        """Body fields a line may carry beyond the endpoint's documented ones (`model_info.allowed_params`)."""
        # What every deployment allows: the Router may send a line to any of them.
        return _common(frozenset(e.model_info.allowed_params) for e in self.entries)

    @property
    def allowed_media_domains(self) -> frozenset[str]:
        """Hosts whose media URLs the gateway may fetch for a line (`model_info.allowed_media_domains`)."""
        return _common(frozenset(e.model_info.allowed_media_domains) for e in self.entries)


def _common(sets: Iterable[frozenset[str]]) -> frozenset[str]:
    listed = list(sets)
    return frozenset.intersection(*listed) if listed else frozenset()


__all__ = ["BackgroundServer", "Route", "RouteKind", "metrics_url", "native_refusal"]
