"""The in-process vLLM engine: `LocalEngineBackend` and the tiny test models.

Importing this package imports neither vLLM nor torch: `LocalEngineBackend.start()`
does, so the gateway core works without the engine extra installed. The names
below are loaded on first use (which also keeps `python -m local_engine.tiny_model`
free of runpy's double-import warning).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from local_engine.backend import EngineStartError, LocalEngineBackend
    from local_engine.tiny_model import TinyModels, build_tiny_models

__all__ = ["EngineStartError", "LocalEngineBackend", "TinyModels", "build_tiny_models"]

_WHERE = {
    "EngineStartError": "local_engine.backend",
    "LocalEngineBackend": "local_engine.backend",
    "TinyModels": "local_engine.tiny_model",
    "build_tiny_models": "local_engine.tiny_model",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'local_engine' has no attribute {name!r}")
