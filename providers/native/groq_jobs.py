"""Groq's batch jobs (`UpstreamJobs`): OpenAI's Batch API as Groq serves it, through the OpenAI-format core.

Groq's Files and Batch API is OpenAI's under `https://api.groq.com/openai/v1` (its reference and SDK), so the
calls are LiteLLM's OpenAI file and batch functions pointed at that base with the deployment's key (else
`GROQ_API_KEY`). What differs, and is Groq's here:
- a batch takes `/v1/chat/completions` only, 50,000 lines and 100 MB per input file;
- `completion_window` from `24h` to `7d` (`native_completion_window`; checked at load), where OpenAI takes `24h`;
- its batch list documents no paging parameter: one request, the list as Groq answers it (a page that names its
  continuation with `has_more` and `last_id` is still followed);
- prices: only batch prices (`*_cost_per_token_batches` in LiteLLM's map, else `model_info`): Groq's discount is
  not one rule over its real-time prices, so none are derived from them.
"""

from __future__ import annotations

import os
from typing import Any

from gateway.config.entries import NativeModelInfo
from gateway.domain import Endpoint
from providers.native.openai_jobs import OpenAIJobs

GROQ_BASE = "https://api.groq.com/openai/v1"


class GroqJobs(OpenAIJobs):
    """`groq/` deployments: chat completions as Groq batch jobs."""

    providers = ("groq",)
    endpoints = frozenset({Endpoint.CHAT})
    credentials = ("api_base", "api_key")
    completion_windows = (24, 168)
    batch_discount = None
    default_base = GROQ_BASE
    key_variable = "GROQ_API_KEY"

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        # LiteLLM's OpenAI calls, at Groq's base: its Files and Batch API is OpenAI's
        openai_kwargs = {**kwargs, "custom_llm_provider": "openai", "api_base": kwargs.get("api_base") or GROQ_BASE,
                         "api_key": kwargs.get("api_key") or os.environ.get("GROQ_API_KEY")}
        super().__init__(litellm, provider, model, openai_kwargs, info)
