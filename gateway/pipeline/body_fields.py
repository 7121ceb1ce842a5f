"""What each endpoint's request body must hold, and what it may hold.

Must: a chat line without `messages` would otherwise pass validation and fail
later, one paid upstream call per line. Only checks that are cheap (a dict
lookup and an isinstance) and certain (every server of that endpoint refuses
the body) live here; the rest is the serving engine's or provider's to judge.

May: a line's body is data, never configuration. An upstream route takes the
endpoint's documented request fields only (`upstream_fields`: OpenAI's request
schemas, as the pinned `openai` SDK's generated request types spell them),
plus the provider extras the operator lists for that model
(`model_info.allowed_params`). Anything else is that line's 400: LiteLLM takes
keyword arguments for keys, base URLs, providers, headers, timeouts, retries,
fallbacks, mocks, prices and callbacks, and a line must reach none of them.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from gateway.errors import LineCode, LineError
from gateway.records import BatchRequest, Endpoint, Result

# Per endpoint, the alternative sets of required fields: the body must hold every
# field of at least one set. vLLM's score takes any one of its four pairs
# (vllm/entrypoints/pooling/scoring/protocol.py); audio takes a URL or the file.
REQUIRED: dict[Endpoint, tuple[tuple[str, ...], ...]] = {
    Endpoint.CHAT: (("messages",),),
    Endpoint.COMPLETIONS: (("prompt",),),
    Endpoint.EMBEDDINGS: (("input",),),
    Endpoint.RESPONSES: (("input",),),
    Endpoint.MODERATIONS: (("input",),),
    Endpoint.IMAGES: (("prompt",),),
    Endpoint.TRANSCRIPTIONS: (("file_url",), ("file",)),
    Endpoint.TRANSLATIONS: (("file_url",), ("file",)),
    Endpoint.SCORE: (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")),
    Endpoint.RERANK: (("query", "documents"),),
}

_STRING_OR_ARRAY = ((str, list), "a string or an array")
# Field -> (accepted types, how OpenAI names them), per endpoint.
_TYPES: dict[Endpoint, dict[str, tuple[tuple[type, ...], str]]] = {
    Endpoint.CHAT: {"messages": ((list,), "an array")},
    Endpoint.COMPLETIONS: {"prompt": _STRING_OR_ARRAY},
    Endpoint.EMBEDDINGS: {"input": _STRING_OR_ARRAY},
    Endpoint.RESPONSES: {"input": _STRING_OR_ARRAY},
    Endpoint.MODERATIONS: {"input": _STRING_OR_ARRAY},
    Endpoint.IMAGES: {"prompt": ((str,), "a string")},
}

_JSON_NAMES = {str: "a string", list: "an array", dict: "an object", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def check_body(endpoint: Endpoint, body: dict[str, Any], line: int) -> LineError | None:
    """The first missing or mistyped field of `body`, in OpenAI's words; None when it is fine."""
    alternatives = REQUIRED.get(endpoint, ())
    if alternatives and not any(all(body.get(f) is not None for f in fields) for fields in alternatives):
        # name the first field missing from the set the body came closest to
        closest = max(alternatives, key=lambda fields: sum(body.get(f) is not None for f in fields))
        missing = next(f for f in closest if body.get(f) is None)
        return LineError(LineCode.MISSING_REQUIRED_PARAMETER,
                         f"Missing required parameter: 'body.{missing}'.", line, f"body.{missing}")
    for name, (types, wanted) in _TYPES.get(endpoint, {}).items():
        value = body.get(name)
        if value is not None and not isinstance(value, types):
            got = _JSON_NAMES.get(type(value), type(value).__name__)
            return LineError(LineCode.INVALID_TYPE,
                             f"Invalid type for 'body.{name}': expected {wanted}, but got {got} instead.",
                             line, f"body.{name}")
    return None


# Rerank is no OpenAI endpoint: its fields are Cohere's v2 rerank request, the one LiteLLM's `rerank` takes
# (model, query, documents, top_n, rank_fields, return_documents, max_chunks_per_doc, max_tokens_per_doc).
_RERANK_FIELDS = frozenset({"model", "query", "documents", "top_n", "rank_fields", "return_documents",
                            "max_chunks_per_doc", "max_tokens_per_doc"})


@functools.cache
def upstream_fields(endpoint: Endpoint) -> frozenset[str]:
    """The request fields OpenAI documents for `endpoint` (empty for an endpoint no upstream route serves).

    Read from the `openai` SDK's request types, which Stainless generates from `openai/openai-openapi`, so
    the list follows the pinned SDK instead of a hand-kept copy. `stream` lives in the SDK's streaming
    variants; validation answers `stream: true` itself. Imported on first use: only workers need it."""
    from openai.types import (
        completion_create_params,
        embedding_create_params,
        image_generate_params,
        moderation_create_params,
    )
    from openai.types.chat import completion_create_params as chat_params
    from openai.types.responses import response_create_params

    typed: dict[Endpoint, Any] = {
        Endpoint.CHAT: chat_params.CompletionCreateParamsBase,
        Endpoint.COMPLETIONS: completion_create_params.CompletionCreateParamsBase,
        Endpoint.EMBEDDINGS: embedding_create_params.EmbeddingCreateParams,
        Endpoint.RESPONSES: response_create_params.ResponseCreateParamsBase,
        Endpoint.MODERATIONS: moderation_create_params.ModerationCreateParams,
        Endpoint.IMAGES: image_generate_params.ImageGenerateParamsBase,
    }
    if endpoint is Endpoint.RERANK:
        return _RERANK_FIELDS
    params = typed.get(endpoint)
    if params is None:
        return frozenset()
    names: set[str] = set()
    for klass in params.__mro__:  # a TypedDict's own annotations, and those of the bases it extends
        names.update(getattr(klass, "__annotations__", {}))
    return frozenset(names | {"stream"})


# Fields OpenAI documents that LiteLLM also reads as its own keyword argument: `metadata` is LiteLLM's logging
# and routing metadata (tags pick deployments), not the provider's. Through LiteLLM's translation a line may
# not set it; the OpenAI-wire pass-through sends it to the provider as data.
LITELLM_OWN_FIELDS = frozenset({"metadata"})


def unknown_field(body: dict[str, Any], known: Collection[str]) -> str | None:
    """The first field of `body` outside `known`, in the body's order; None when every field is known."""
    for name in body:
        if name not in known:
            return name
    return None


def unrecognized(req: BatchRequest, name: str) -> Result:
    """The line's 400 for a body field the route does not take, in OpenAI's words."""
    return Result.http_error(req.line, req.custom_id, 400, f"Unrecognized request argument supplied: {name}",
                             type_="invalid_request_error", code="unknown_parameter", model=req.model,
                             param=name)


def unsupported(req: BatchRequest, name: str, why: str) -> Result:
    """The line's 400 for a documented field this route cannot honour, in OpenAI's words and the reason."""
    return Result.http_error(req.line, req.custom_id, 400,
                             f"Unsupported parameter: '{name}' is not supported with this model ({why}).",
                             type_="invalid_request_error", code="unsupported_parameter", model=req.model,
                             param=name)
