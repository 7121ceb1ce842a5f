"""What each native provider's jobs declare to the config, handed in by the composition root.

The config may not import a provider (`providers/` is above it): the root (`gateway.runtime.pool.
declare_native_providers`, called by the command line and by tests) hands in a loader of the providers'
declarations, the `UpstreamJobs` classes themselves. A native entry is then checked against its provider's:
the provider has jobs, its model is one they run, the `native_*` keys are its own and the required ones set.
The loader runs the first time a native entry is read, so a config without one imports no provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pydantic_core import PydanticCustomError

from gateway.domain import Endpoint


class NativeDeclaration(Protocol):
    """The class attributes of a provider's `UpstreamJobs` that the config reads."""

    endpoints: frozenset[Endpoint]
    settings: frozenset[str]  # its own `native_*` keys of `model_info`
    required_settings: tuple[str, ...]
    settings_purpose: str  # what the required settings are, for the refusal that names one
    completion_windows: tuple[int, int] | None  # hours a `native_completion_window` may take; None: the host's own
    batch_discount: float | None  # a batch's share of the real-time price; None: only batch prices count

    def model_refusal(self, model: str) -> str | None:
        """Why its jobs cannot run `model` (the part after `provider/`); None: they can."""


Declarations = Mapping[str, NativeDeclaration]  # provider prefix -> its jobs' declaration

_loader: Callable[[], Declarations] | None = None


def declare_native(loader: Callable[[], Declarations]) -> None:
    """Hand in the native providers (the composition root, once per process, before a config is read)."""
    global _loader
    _loader = loader


def window_hours(window: str) -> int:
    """`24h`, `7d`: the hours of a completion window (the form `NativeModelInfo` checks)."""
    return int(window[:-1]) * (24 if window.endswith("d") else 1)


def entry_refusal(provider: str, model: str, info: Any) -> PydanticCustomError | None:
    """Why a native entry of `provider/model` with this `model_info` (a `NativeModelInfo`) is refused; None: not.

    Its provider's declaration decides: the `native_*` keys are its own, the required ones set, the model one
    its jobs run, the completion window one the provider takes."""
    declared = native_declarations()
    mine = declared[provider]
    others = frozenset().union(*(d.settings for d in declared.values())) - mine.settings
    given = sorted(k for k in others if k in info.model_fields_set)
    if given:
        owners = sorted(p for p, d in declared.items() if d.settings & set(given))
        return PydanticCustomError("native_key", "{names}: not a setting of a {provider}/ deployment (keys of "
                                   "the {owners} batch jobs)",
                                   {"names": ", ".join(given), "provider": provider,
                                    "owners": ", ".join(f"{p}/" for p in owners)})
    missing = [k for k in mine.required_settings if not getattr(info, k)]
    if missing:
        return PydanticCustomError("native_storage", "batch_mode: native on {provider}/ needs {key} ({purpose})",
                                   {"provider": provider, "key": missing[0], "purpose": mine.settings_purpose})
    refusal = mine.model_refusal(model)
    if refusal is not None:
        return PydanticCustomError("native_provider", "batch_mode: native on {provider}/ {refusal}",
                                   {"provider": provider, "refusal": refusal})
    window = getattr(info, "native_completion_window", None)
    bounds = mine.completion_windows
    if window is not None and bounds is not None and not bounds[0] <= window_hours(window) <= bounds[1]:
        return PydanticCustomError("native_window", "native_completion_window {window}: {provider}/ batches take "
                                   "{low}h to {high}h", {"window": window, "provider": provider,
                                                         "low": bounds[0], "high": bounds[1]})
    return None


def batch_discount(model: str) -> float | None:
    """A native deployment of `model`'s batch share of its real-time price (`gateway.config.prices.batch_prices`)."""
    declared = native_declarations().get(model.partition("/")[0])
    return declared.batch_discount if declared is not None else 0.5


def native_declarations() -> Declarations:
    if _loader is None:
        raise RuntimeError("no native providers were declared: the composition root calls "
                           "gateway.runtime.pool.declare_native_providers() before it reads a config")
    return _loader()


__all__ = ["Declarations", "NativeDeclaration", "batch_discount", "declare_native", "entry_refusal",
           "native_declarations", "window_hours"]
