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

from gateway.records import Endpoint

_TAILS: dict[str, Endpoint] = {
    "chat/completions": Endpoint.CHAT,
    "completions": Endpoint.COMPLETIONS,
    "embeddings": Endpoint.EMBEDDINGS,
    "responses": Endpoint.RESPONSES,
    "score": Endpoint.SCORE,
    "rerank": Endpoint.RERANK,
    "moderations": Endpoint.MODERATIONS,
    "images/generations": Endpoint.IMAGES,
    "audio/transcriptions": Endpoint.TRANSCRIPTIONS,
    "audio/translations": Endpoint.TRANSLATIONS,
}

# prefix groups: "", "v1/", "openai/", "openai/v1/", "openai/deployments/{d}/", and "v2/" for rerank
_URL = re.compile(
    r"^/?(?:(?P<v>v1|v2)/|openai/(?:v1/)?|openai/deployments/(?P<deployment>[^/?#]+)/)?"
    r"(?P<tail>chat/completions|completions|embeddings|responses|score|rerank|moderations|images/generations"
    r"|audio/transcriptions|audio/translations)/?$"
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
