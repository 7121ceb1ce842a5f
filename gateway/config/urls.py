"""Normalising a batch line's `url` to its canonical endpoint.

Callers write the same endpoint many ways: OpenAI's `/v1/chat/completions`,
Azure's `/chat/completions` and `/openai/deployments/{d}/chat/completions`,
LiteLLM's `/openai/v1/...`, vLLM's `/v1/score`, Cohere-style `/v2/rerank`,
and the audio endpoints run_batch serves (`/v1/audio/transcriptions|translations`);
moderations and image generations take the same prefixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.config.endpoints import ENDPOINTS
from gateway.domain import Endpoint

_TAILS: dict[str, Endpoint] = {rule.tail: endpoint for endpoint, rule in ENDPOINTS.items()}

# prefix groups: "", "v1/", "openai/", "openai/v1/", "openai/deployments/{d}/", and "v2/" for rerank
_URL = re.compile(
    r"^/?(?:(?P<v>v1|v2)/|openai/(?:v1/)?|openai/deployments/(?P<deployment>[^/?#]+)/)?"
    r"(?P<tail>" + "|".join(re.escape(tail) for tail in sorted(_TAILS, key=len, reverse=True)) + r")/?$"
)


@dataclass(frozen=True, slots=True)
class NormalisedUrl:
    endpoint: Endpoint
    deployment: str | None  # from an Azure deployment path; the model when the body has none


def normalise_url(url: str) -> NormalisedUrl | None:
    """The canonical endpoint of `url`, or None when it names no endpoint we serve.

    The query string (Azure's `?api-version=`) is ignored.
    """
    path = url.split("?", 1)[0].strip()
    m = _URL.match(path)
    if m is None:
        return None
    tail = m.group("tail")
    if m.group("v") == "v2" and tail != "rerank":
        return None
    return NormalisedUrl(endpoint=_TAILS[tail], deployment=m.group("deployment"))


def normalise_endpoint(endpoint: str) -> Endpoint | None:
    """A batch's `endpoint` field (`/v1/chat/completions`, or Azure's `/chat/completions`)."""
    n = normalise_url(endpoint)
    return n.endpoint if n else None
