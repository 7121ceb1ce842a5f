"""Which provider's jobs run a native deployment: every `UpstreamJobs` subclass in this package's `*_jobs`
modules that names its `providers`, found by looking, so that adding a provider is adding its file.

The composition root hands the catalog to the config (`gateway.config.native_declarations`), which checks a
native entry against the class's declaration; the runner makes the deployment's jobs from it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping

import providers.native
from providers.native.contract import UpstreamJobs
from providers.native.job_limits import JOB_LIMITS


@functools.cache
def native_catalog() -> Mapping[str, type[UpstreamJobs]]:
    """Provider prefix (`openai`, `bedrock`, ...) -> its jobs class (each `*_jobs` module imported once: their
    LiteLLM imports are lazy, so this costs milliseconds)."""
    found: dict[str, type[UpstreamJobs]] = {}
    for module_info in sorted(pkgutil.iter_modules(providers.native.__path__), key=lambda m: m.name):
        if not module_info.name.endswith("_jobs"):
            continue
        module = importlib.import_module(f"{providers.native.__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, UpstreamJobs) and value.__module__ == module.__name__:
                for provider in value.providers:
                    if provider in found:
                        raise RuntimeError(f"two native jobs classes serve {provider}/: {found[provider]}, {value}")
                    if provider not in JOB_LIMITS:
                        raise RuntimeError(f"{provider}/ has native jobs but no row in providers.native.job_limits")
                    found[provider] = value
    return found


def jobs_class(provider: str) -> type[UpstreamJobs] | None:
    """The `UpstreamJobs` class of a provider; None for a provider with no native jobs."""
    return native_catalog().get(provider)


__all__ = ["jobs_class", "native_catalog"]
