"""One scrape's body: this process's instruments (or, with a multiprocess directory, every process's of
the machine, summed) and the shared state, as Prometheus text or OpenMetrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from gateway.metrics.instruments import built
from gateway.metrics.multiproc import multiprocess_dir
from gateway.metrics.shared_state import SharedState

if TYPE_CHECKING:
    from prometheus_client.registry import Collector


class _Forward:
    """The default registry's metrics (this process's, and a local vLLM engine's) in a scrape's registry."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


def render(shared: SharedState | None, accept: str | None) -> tuple[bytes, str]:
    """The scrape's body and content type (Prometheus text, or OpenMetrics when asked for)."""
    built()  # the families exist from the first scrape on, even before anything was counted
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    directory = multiprocess_dir()
    if directory:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_as_collector(_Forward()))
    if shared is not None:
        registry.register(_as_collector(shared))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def _as_collector(obj: Any) -> Collector:
    return cast("Collector", obj)  # prometheus-client takes anything with collect()


__all__ = ["render"]
