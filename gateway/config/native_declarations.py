"""What each native provider's jobs declare to the config, handed in by the composition root.

The config may not import a provider (`providers/` is above it): the root (`gateway.runtime.pool.
declare_native_providers`, called by the command line and by tests) hands in a loader of the providers'
declarations, the `UpstreamJobs` classes themselves. A native entry is then checked against its provider's:
the provider has jobs, its model is one they run, the `native_*` keys are its own and the required ones set.
The loader runs the first time a native entry is read, so a config without one imports no provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.domain import Endpoint


class NativeDeclaration(Protocol):
    """The class attributes of a provider's `UpstreamJobs` that the config reads."""

    endpoints: frozenset[Endpoint]
    settings: frozenset[str]  # its own `native_*` keys of `model_info`
    required_settings: tuple[str, ...]
    settings_purpose: str  # what the required settings are, for the refusal that names one
    batch_discount: float | None  # a batch's share of a real-time price; None: only batch prices count

    def model_refusal(self, model: str) -> str | None:
        """Why its jobs cannot run `model` (the part after `provider/`); None: they can."""


Declarations = Mapping[str, NativeDeclaration]  # provider prefix -> its jobs' declaration

_loader: Callable[[], Declarations] | None = None


def declare_native(loader: Callable[[], Declarations]) -> None:
    """Hand in the native providers (the composition root, once per process, before a config is read)."""
    global _loader
    _loader = loader


def native_declarations() -> Declarations:
    if _loader is None:
        raise RuntimeError("no native providers were declared: the composition root calls "
                           "gateway.runtime.pool.declare_native_providers() before it reads a config")
    return _loader()


def batch_discount(model: str) -> float | None:
    """The batch discount the provider of a native deployment's `model` (`provider/name`) declares."""
    declared = native_declarations().get(model.partition("/")[0])
    return declared.batch_discount if declared is not None else 0.5


__all__ = ["Declarations", "NativeDeclaration", "batch_discount", "declare_native", "native_declarations"]
