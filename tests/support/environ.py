"""Putting the process environment back after a test changed it, keeping what an import set once per process.

LiteLLM sets `TIKTOKEN_CACHE_DIR` (to the encodings its wheel bundles) when it is first imported, never again:
an environment restored from before that import loses it, and the next OpenAI model counted in this process
makes tiktoken download its encoding (CI has no route to openaipublic.blob.core.windows.net)."""

from __future__ import annotations

import os
from collections.abc import Mapping

SET_ON_IMPORT = ("TIKTOKEN_CACHE_DIR",)


def restore(saved: Mapping[str, str]) -> None:
    """Make `os.environ` equal to `saved`, but for the variables an import set since (`SET_ON_IMPORT`)."""
    kept = {name: os.environ[name] for name in SET_ON_IMPORT if name in os.environ and name not in saved}
    os.environ.clear()
    os.environ.update(saved)
    os.environ.update(kept)
